"""``npsemiseg plan``: a cell on the GPUs a run will get (``--gpus 2x24GB``): processes x per-process batch x
accumulation steps keeping the publication's global batch, the predicted peak memory per GPU
(``npsemiseg.hardware_plan``'s memory model), and what differs from the publication."""

from __future__ import annotations

from pathlib import Path

import typer

from npsemiseg.data import dataset_names
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.presets import preset_names
from semiseg_platform.cli.app import app, fail, one_line, parse_assignments
from semiseg_platform.cli.run import build_composition


@app.command()
def plan(
    gpus: str = typer.Option(..., "--gpus", help="the GPUs the run gets: COUNTxMEMORY, e.g. 2x24GB or 8x80GB"),
    framework: str | None = typer.Option(None, help=" | ".join(framework_names())),
    dataset: str | None = typer.Option(None, help=" | ".join(dataset_names()) + " | a folder dataset (docs/datasets.md)"),
    partition: str | None = typer.Option(None, help="labeled-image count or protocol, e.g. 92 or 1/16"),
    head: str | None = typer.Option(None, help=" | ".join(head_names())),
    preset: str = typer.Option("paper", help=" | ".join(preset_names())),
    protocol: str | None = typer.Option(None, help="released | corrected (default corrected)"),
    config: Path | None = typer.Option(None, "--config", help="a configuration YAML (replaces --preset)"),
    set_: list[str] | None = typer.Option(None, "--set", help="override a setting: key=value (repeatable)"),
) -> None:
    """Plan a cell on the given GPUs: processes x batch x accumulation steps, predicted peak memory per GPU."""
    from npsemiseg.hardware_plan import parse_gpus, plan_cell

    try:
        wanted = parse_gpus(gpus)
        composition = build_composition(framework=framework, dataset=dataset, partition=partition, head=head,
                                        preset=preset, config_file=config, assignments=parse_assignments(set_),
                                        protocol=protocol)
        planned = plan_cell(composition.config, wanted)
    except ValueError as error:
        fail(one_line(error))
    typer.echo(f"# cell {composition.config.run_name} ({composition.config.cell_id}) on {wanted}")
    typer.echo(planned.describe())
    for line in planned.differences:
        typer.echo(f"  differs: {line}")

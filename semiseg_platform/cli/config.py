"""``npsemiseg config show``: a cell's whole configuration and where each value comes from.

The configuration is composed exactly as ``npsemiseg run`` would compose it (the same options), then
printed key by key with the step that set it last and why; ``--explain KEY`` prints every step that set
``KEY`` (or each key of a section) in order; ``--json`` the whole provenance as JSON (what every run logs
as ``config/config_provenance.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from npsemiseg.data import dataset_names
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.presets import preset_names
from semiseg_platform.cli.app import app, fail, one_line, parse_assignments
from semiseg_platform.cli.run import build_composition

config_app = typer.Typer(help="Show a cell's configuration and where each value comes from.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def show(
    framework: str | None = typer.Option(None, help=" | ".join(framework_names())),
    dataset: str | None = typer.Option(None, help=" | ".join(dataset_names()) + " | a folder dataset (docs/datasets.md)"),
    partition: str | None = typer.Option(None, help="labeled-image count or protocol, e.g. 92 or 1/16"),
    head: str | None = typer.Option(None, help=" | ".join(head_names())),
    preset: str = typer.Option("smoke", help=" | ".join(preset_names())),
    protocol: str | None = typer.Option(None, help="released | corrected (default corrected)"),
    config: Path | None = typer.Option(None, "--config", help="a configuration YAML (replaces --preset)"),
    set_: list[str] | None = typer.Option(None, "--set", help="override a setting: key=value (repeatable)"),
    explain: str | None = typer.Option(None, "--explain", help="one key (or section): every step that set it"),
    as_json: bool = typer.Option(False, "--json", help="the provenance of every key as JSON"),
) -> None:
    """Print the cell's configuration, one key per line with the step that set it and why."""
    try:
        composition = build_composition(framework=framework, dataset=dataset, partition=partition, head=head,
                                        preset=preset, config_file=config, assignments=parse_assignments(set_),
                                        protocol=protocol)
        if as_json:
            data = composition.to_json()
            keys = composition.keys(explain) if explain else list(data)
            text = json.dumps({k: data[k] for k in keys}, indent=2)
        else:
            text = composition.explain(explain) if explain else composition.show()
    except ValueError as error:
        fail(one_line(error))
    config_ = composition.config
    if not as_json:
        typer.echo(f"# cell {config_.run_name} ({config_.cell_id})")
    typer.echo(text)

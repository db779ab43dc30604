"""What a cell run shows in the MLflow UI: its description (Markdown) and the per-class IoU figure."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

from npsemiseg.config import RunConfig
from npsemiseg.heads import head_class
from npsemiseg.heads.factory import head_options
from semiseg_platform.tracking import mlflow_names


def cell_description(config: RunConfig, *, grid_id: str | None = None, search_id: str | None = None) -> str:
    """What a cell is, in Markdown, for the run's description (``mlflow.note.content``).

    Names the framework, the dataset (and the real dataset a synthetic one stands in for), the
    partition (labeled count and protocol), the head's label with the options it changes from
    the head's defaults, the seed, the preset-level scale (steps, crop, T) and the identifiers.
    """
    info = config.dataset_info
    protocols = [alias for alias, name in info.partition_aliases.items() if name == config.partition and "/" in alias]
    partition = f"partition `{config.partition}`"
    if protocols:
        partition += f" ({protocols[0]} labeled)"
    dataset = f"`{config.dataset}`"
    if info.real_dataset and info.real_dataset != config.dataset:
        dataset += f" (synthetic stand-in for `{info.real_dataset}`)"
    defaults = head_options(config.head.name)
    changed = {key: value for key, value in config.head.options.items() if defaults.get(key) != value}
    head = f"head `{config.head.label}`: {head_class(config.head.name).description}"
    if changed and config.head.label != config.head.name:
        head += "; " + ", ".join(f"{key} = {value}" for key, value in sorted(changed.items()))
    schedule = config.schedule
    steps = f"{schedule.max_steps} steps" if schedule.max_steps else f"{schedule.epochs} epochs"
    member = (f", grid `{grid_id}`" if grid_id else "") + (f", search `{search_id}`" if search_id else "")
    framework = f"`{config.framework}`"
    if config.framework_label != config.framework:
        framework += f" (label `{config.framework_label}`, decoder `{config.model.decoder}`)"
    lines = [
        f"**{config.run_name}**: framework {framework} on {dataset}, {partition}, {head}; seed {config.seed}; "
        f"protocol `{config.protocol}`.",
        "",
        f"Training: {steps}, crop {schedule.crop_size}, batch {schedule.batch_size}; evaluation "
        f"`{config.evaluation.mode}` with T = {config.evaluation.num_samples} predictions.",
        "",
        f"Cell `{config.cell_id}`{member}. Figures: " + ", ".join(f"`{path}`" for path in mlflow_names.CELL_FIGURES)
        + f"; configuration: `{mlflow_names.CONFIG_ARTIFACT}`.",
    ]
    return "\n".join(lines)


def per_class_iou_figure(iou: Mapping[str, float], *, title: str | None = None) -> Figure:
    """A horizontal bar per class (IoU in %); classes absent from the evaluation (NaN) are marked."""
    if not iou:
        raise ValueError("iou: expected at least one class, got none")
    names = list(iou)
    values = [float(v) for v in iou.values()]
    figure = Figure(figsize=(5.0, 0.8 + 0.28 * len(names)), layout="constrained")
    ax = figure.subplots()
    positions = range(len(names))
    ax.barh(positions, [0.0 if v != v else 100 * v for v in values], color="#4c72b0")
    for y, value in zip(positions, values):
        ax.text(1 if value != value else 100 * value + 1, y, "n/a" if value != value else f"{100 * value:.1f}",
                va="center", fontsize=8)
    ax.set_yticks(list(positions), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 110)
    ax.set_xlabel("IoU (%)")
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    return figure

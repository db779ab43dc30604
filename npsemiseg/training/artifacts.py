"""Evaluation during and at the end of a run, and the files it reports: the uncertainty-map figure,
the reliability diagram, the risk-coverage plot (with their data) and the per-class IoU tables
(``Callbacks.on_artifact``)."""

from __future__ import annotations

import contextlib
import csv
import json
import tempfile
from pathlib import Path

import torch
from torch.utils.data import Dataset

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig
from npsemiseg.evaluation.evaluator import CURVES_FILE, evaluate
from npsemiseg.frameworks import Framework
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.training.data_order import derive_seed
from npsemiseg.training.selection import STUDENT_PREFIX, scalar_metrics
from npsemiseg.training.step import autocast

#: figures the final evaluation reports through ``Callbacks.on_artifact`` (stable artifact names)
UNCERTAINTY_ARTIFACT = "figures/uncertainty_maps.png"
RELIABILITY_ARTIFACT = "figures/reliability.png"
RISK_COVERAGE_ARTIFACT = "figures/risk_coverage.png"
#: the data of the two figures above (``npsemiseg.evaluation.evaluator.curves_data``), read by the per-grid figures
CURVES_ARTIFACT = f"figures/{CURVES_FILE}"
#: validation images shown (one row each) in the uncertainty-map figure
FIGURE_IMAGES = 4


def evaluate_run(framework: Framework, datasets: dict[str, Dataset], config: RunConfig, *, step: int,
                 device: torch.device, figure_dir: Path | None = None,
                 curves_file: Path | None = None) -> dict[str, float]:
    """Evaluate ``framework.eval_model()`` on the validation split under a forked, seeded RNG; with
    ``evaluation.also_student``, the student's scalar metrics too, as ``student/<metric>``."""
    evaluated = framework.eval_model()
    metrics = evaluate_model(evaluated, datasets["val"], config, step=step, device=device,
                             figure_dir=figure_dir, curves_file=curves_file)
    if config.evaluation.also_student:
        student = unwrap(framework.student)
        own = metrics if student is unwrap(evaluated) else evaluate_model(student, datasets["val"], config, step=step,
                                                                          device=device)
        metrics.update({f"{STUDENT_PREFIX}{k}": v for k, v in scalar_metrics(own).items()})
    return metrics


def evaluate_model(model: torch.nn.Module, val: Dataset, config: RunConfig, *, step: int, device: torch.device,
                   figure_dir: Path | None = None, curves_file: Path | None = None) -> dict[str, float]:
    """Evaluate ``model`` on ``val`` as ``config.evaluation`` says, under an RNG forked and seeded by
    ``(seed, step)``: the same model, config and step give the same metrics (a checkpoint evaluated
    again reproduces the run's evaluation)."""
    ev = config.evaluation
    # a deterministic head makes exactly one prediction; T applies to stochastic heads only
    num_samples = ev.num_samples if getattr(unwrap(model).head, "stochastic", True) else None
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(derive_seed(config.seed, "evaluation", step))
        with autocast(config, device):
            metrics = evaluate(
                model, val, num_classes=config.num_classes, mode=ev.mode,
                num_samples=num_samples, **ev.predict_options(ev.mode),
                class_names=config.dataset_info.class_names, max_images=ev.max_images,
                pavpu_window=ev.pavpu_window, pavpu_accuracy_threshold=ev.pavpu_accuracy_threshold,
                pavpu_uncertainty_threshold=ev.pavpu_uncertainty_threshold,
                figure_dir=figure_dir, num_figures=FIGURE_IMAGES if figure_dir is not None else 0,
                curves_file=curves_file,
            )
    return {k: float(v) for k, v in metrics.items()}


def final_evaluation(framework: Framework, datasets: dict[str, Dataset], config: RunConfig, *, step: int,
                     device: torch.device, rank: int, output_dir: Path | None, callbacks: Callbacks) -> dict[str, float]:
    """The last evaluation, with the uncertainty-map figure, the reliability diagram and the risk-coverage plot when
    asked; the data of the last two (``CURVES_ARTIFACT``, a few KB, for the reports' per-grid figures) always."""
    if not config.evaluation.figures:
        with tempfile.TemporaryDirectory(prefix="npsemiseg-curves-") as scratch:
            curves = Path(scratch) / Path(CURVES_ARTIFACT).name
            metrics = evaluate_run(framework, datasets, config, step=step, device=device, curves_file=curves)
            callbacks.on_evaluation(step, metrics)
            if rank == 0 and curves.is_file():
                callbacks.on_artifact(CURVES_ARTIFACT, curves)
        return metrics
    with contextlib.ExitStack() as stack:
        if output_dir is not None:
            figure_dir = output_dir / "figures"
        else:  # the files live while the callbacks copy them
            figure_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="npsemiseg-figures-")))
        metrics = evaluate_run(framework, datasets, config, step=step, device=device, figure_dir=figure_dir)
        callbacks.on_evaluation(step, metrics)
        if rank == 0:
            for name in (UNCERTAINTY_ARTIFACT, RELIABILITY_ARTIFACT, RISK_COVERAGE_ARTIFACT, CURVES_ARTIFACT):
                written = figure_dir / Path(name).name
                if written.is_file():
                    callbacks.on_artifact(name, written)
    return metrics


def per_class_artifacts(metrics: dict[str, float], output_dir: Path | None, callbacks: Callbacks) -> None:
    """``tables/per_class_iou.csv`` and ``.json`` from the final metrics' ``iou/<class>`` entries."""
    rows = [(k.split("/", 1)[1], v) for k, v in metrics.items() if k.startswith("iou/")]
    if not rows:
        return
    with contextlib.ExitStack() as stack:
        directory = (output_dir / "tables") if output_dir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="npsemiseg-tables-")))
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "per_class_iou.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["class", "iou"])
            writer.writerows(rows)
        (directory / "per_class_iou.json").write_text(json.dumps(dict(rows), indent=1, allow_nan=True))
        callbacks.on_artifact("tables/per_class_iou.csv", directory / "per_class_iou.csv")
        callbacks.on_artifact("tables/per_class_iou.json", directory / "per_class_iou.json")

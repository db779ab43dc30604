"""``evaluate``: every metric of the paper for one model over a dataset, in one pass."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import Dataset

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.evaluation.calibration import Calibration
from npsemiseg.evaluation.inference import DEFAULT_CROP_SIZE, center_crop, predict
from npsemiseg.evaluation.metrics import ConfusionMatrix, PAvPU, all_reduce_sum
from npsemiseg.evaluation.visualize import (
    save_png,
    save_reliability_diagram,
    save_risk_coverage_plot,
    stack_panels,
    uncertainty_panel,
)

#: the figures' data (reliability bins, risk-coverage curve) rank 0 writes beside them, for the reports' per-grid
#: figures; the risk-coverage curve is thinned to at most this many points
CURVES_FILE, CURVE_POINTS = "reliability_curves.json", 257


def _rank_and_world(distributed: bool | None) -> tuple[int, int, bool]:
    initialised = dist.is_available() and dist.is_initialized()
    if distributed is None:
        distributed = initialised
    if distributed and not initialised:
        raise ValueError("distributed: True needs torch.distributed to be initialised first")
    if not distributed:
        return 0, 1, False
    return dist.get_rank(), dist.get_world_size(), True


def _batches(data: Any, rank: int, world_size: int, max_images: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """``(images [B, 3, H, W], labels [B, H, W])`` from a map-style dataset of item dicts (one image
    per batch, sizes may differ; items ``rank::world_size`` of the first ``max_images``) or from an
    iterable of batch dicts (a DataLoader, already sharded per rank; stops after ``max_images``
    images on this rank)."""
    if isinstance(data, Dataset) and hasattr(data, "__len__"):
        count = len(data) if max_images is None else min(len(data), max_images)  # type: ignore[arg-type]
        for index in range(rank, count, world_size):
            item = data[index]
            yield _as_batch(item, f"dataset item {index}")
        return
    if not isinstance(data, Iterable):
        raise ValueError(f"data: expected a map-style Dataset or an iterable of batches, got {type(data).__name__}")
    seen = 0
    for number, batch in enumerate(data):
        images, labels = _as_batch(batch, f"batch {number}")
        if max_images is not None:
            if seen >= max_images:
                return
            images, labels = images[: max_images - seen], labels[: max_images - seen]
        seen += images.shape[0]
        yield images, labels


def _as_batch(item: Any, where: str) -> tuple[Tensor, Tensor]:
    if not isinstance(item, dict) or "image" not in item or "label" not in item:
        raise ValueError(f"data: {where} must be a dict with 'image' and 'label', got {type(item).__name__}")
    images, labels = item["image"], item["label"]
    if images.dim() == 3:
        images, labels = images.unsqueeze(0), labels.unsqueeze(0)
    if images.dim() != 4 or labels.dim() != 3 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"data: {where}: expected image [B, 3, H, W] and label [B, H, W], got {tuple(images.shape)} "
            f"and {tuple(labels.shape)}"
        )
    return images, labels


def _model_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def evaluate(
    model: nn.Module, data: Dataset | Iterable[dict[str, Tensor]], *, num_classes: int, mode: str = "whole",
    num_samples: int | None = None, crop_size: int | tuple[int, int] | None = None, stride: int | None = None,
    class_names: Sequence[str] | None = None, max_images: int | None = None, distributed: bool | None = None,
    ignore_index: int = IGNORE_INDEX, pavpu_window: int = 64, pavpu_accuracy_threshold: float = 0.5,
    pavpu_uncertainty_threshold: float = 0.4, ece_bins: int = 15, figure_dir: str | Path | None = None,
    num_figures: int = 0, curves_file: str | Path | None = None, **predict_options: Any,
) -> dict[str, float]:
    """Evaluate ``model`` (a Segmentor) on ``data`` with ``predict(mode=..., num_samples=...)``.

    data: a map-style dataset of items ``{"image": [3, H, W], "label": [H, W]}`` or an iterable of
    batches ``{"image": [B, 3, H, W], "label": [B, H, W]}``. ``predict_options`` go to ``predict``
    (``scheme``, ``placement``, ``combine``, ``global_scale``, ...). center_crop evaluates the
    labels' center crop (``center_crop``), as U2PL does. The model is put in eval mode for the pass
    and restored afterwards. Under torch.distributed (``distributed=None``: when initialised) every
    rank evaluates its share and the counts are summed, so every rank returns the dataset's values.

    Returns floats: ``miou``, ``pixel_acc``, ``iou/<class name or index>`` (NaN for a class absent
    from predictions and labels), ``pavpu`` (entropy in nats, window ``pavpu_window``, thresholds
    ``pavpu_accuracy_threshold`` / ``pavpu_uncertainty_threshold``), ``pavpu_normalized`` (entropy /
    log K, same thresholds), their class-balanced variants ``pavpu_balanced`` and
    ``pavpu_normalized_balanced`` (``PAvPU``), ``ece``, ``ece_adaptive``, ``nll``, ``brier``, ``auroc``,
    ``aupr``, ``aurc`` (``Calibration``: the uncertainty is the predictive's entropy), ``num_images`` and
    ``seconds_per_image`` (prediction time, averaged over ranks). With ``figure_dir``, rank 0
    writes there ``reliability.png``, ``risk_coverage.png``, their data ``reliability_curves.json`` and,
    for ``num_figures`` > 0, ``uncertainty_maps.png``: one row per image (the first ``num_figures`` it
    evaluated) of image, ground truth, prediction, entropy. ``curves_file``: rank 0 writes the figures' data
    there alone (no figure drawn).
    """
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"class_names: expected {num_classes} names, got {len(class_names)}")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images: expected >= 1 or None, got {max_images}")
    rank, world_size, distributed = _rank_and_world(distributed)
    counts = _Accumulators(
        num_classes, ignore_index, ece_bins=ece_bins, num_panels=num_figures if figure_dir is not None and rank == 0 else 0,
        pavpu=dict(window=pavpu_window, accuracy_threshold=pavpu_accuracy_threshold,
                   uncertainty_threshold=pavpu_uncertainty_threshold, ignore_index=ignore_index),
    )
    was_training = model.training
    model.eval()
    try:
        batches = _batches(data, rank, world_size, max_images)
        num_images, seconds = _predict_batches(model, batches, counts, mode=mode, num_samples=num_samples,
                                               crop_size=crop_size, stride=stride, **predict_options)
    finally:
        model.train(was_training)
    if distributed:
        counts.all_reduce()
        totals = all_reduce_sum(torch.tensor([float(num_images), seconds], dtype=torch.float64))
        num_images, seconds = int(totals[0].item()), float(totals[1].item())
    if num_images == 0:
        raise ValueError("data: no image to evaluate (empty dataset or loader)")
    metrics = counts.metrics(class_names)
    metrics["num_images"] = float(num_images)
    metrics["seconds_per_image"] = seconds / num_images
    if rank == 0:
        counts.write_files(figure_dir, curves_file)
    return metrics


def _predict_batches(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], counts: _Accumulators, *,
                     mode: str, crop_size: int | tuple[int, int] | None, **predict_kwargs: Any) -> tuple[int, float]:
    """Predict every batch (``images [B, 3, H, W]``, ``labels [B, H, W]``) into ``counts``; returns
    the number of images and the seconds spent in ``predict``."""
    device = _model_device(model)
    evaluated_crop = DEFAULT_CROP_SIZE if crop_size is None else crop_size
    num_images, seconds = 0, 0.0
    for images, labels in batches:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True).long()
        if mode == "center_crop":
            images_shown = center_crop(images, evaluated_crop)
            labels = center_crop(labels, evaluated_crop)
        else:
            images_shown = images
        start = time.perf_counter()
        probs, entropy = predict(model, images, mode=mode, crop_size=crop_size, **predict_kwargs)
        seconds += time.perf_counter() - start
        if probs.shape[-2:] != labels.shape[-2:]:
            raise ValueError(
                f"data: labels of size {tuple(labels.shape[-2:])} do not match the predicted "
                f"{tuple(probs.shape[-2:])} (mode {mode!r})"
            )
        counts.update(probs, entropy, labels, images_shown)
        num_images += images.shape[0]
    return num_images, seconds


class _Accumulators:
    """The evaluation's running counts: confusion matrix, PAvPU (nats and normalised), calibration and
    the first ``num_panels`` uncertainty-figure rows."""

    def __init__(self, num_classes: int, ignore_index: int, *, ece_bins: int, num_panels: int,
                 pavpu: dict[str, Any]) -> None:
        self.num_classes, self.ignore_index, self.num_panels = num_classes, ignore_index, num_panels
        self.confusion = ConfusionMatrix(num_classes, ignore_index)
        self.patches = [PAvPU(num_classes, normalize=False, **pavpu), PAvPU(num_classes, normalize=True, **pavpu)]
        self.calibration = Calibration(num_classes, num_bins=ece_bins, ignore_index=ignore_index)
        self.panels: list[Any] = []

    def update(self, probs: Tensor, entropy: Tensor, labels: Tensor, images_shown: Tensor) -> None:
        """``probs [B, K, H, W]``, ``entropy [B, H, W]``, ``labels [B, H, W]``, ``images_shown [B, 3, H, W]``."""
        prediction = probs.argmax(dim=1)
        self.confusion.update(prediction, labels)
        for accumulator in self.patches:
            accumulator.update(prediction, labels, entropy)
        self.calibration.update(probs, labels, entropy)
        for i in range(min(self.num_panels - len(self.panels), images_shown.shape[0])):
            self.panels.append(uncertainty_panel(images_shown[i], prediction[i], labels[i], entropy[i],
                                                 num_classes=self.num_classes, ignore_index=self.ignore_index))

    def all_reduce(self) -> None:
        for accumulator in (self.confusion, *self.patches, self.calibration):
            accumulator.all_reduce()

    def metrics(self, class_names: Sequence[str] | None) -> dict[str, float]:
        segmentation = self.confusion.compute()
        metrics: dict[str, float] = {"miou": segmentation["miou"], "pixel_acc": segmentation["pixel_acc"]}
        for k, iou in enumerate(segmentation["per_class_iou"].tolist()):
            metrics[f"iou/{class_names[k] if class_names is not None else k}"] = iou
        for accumulator in self.patches:
            metrics.update(accumulator.compute())
        metrics.update(self.calibration.compute())
        return metrics

    def write_files(self, figure_dir: str | Path | None, curves_file: str | Path | None) -> None:
        """The figures (and their data) into ``figure_dir``, the data alone into ``curves_file``; each when given."""
        if figure_dir is not None:
            self.write_figures(Path(figure_dir))
        if curves_file is not None:
            self.write_curves(Path(curves_file))

    def write_figures(self, figure_dir: Path) -> None:
        if self.panels:
            save_png(figure_dir / "uncertainty_maps.png", stack_panels(self.panels))
        save_reliability_diagram(figure_dir / "reliability.png", self.calibration.reliability())
        save_risk_coverage_plot(figure_dir / "risk_coverage.png", self.calibration.risk_coverage())
        self.write_curves(figure_dir / CURVES_FILE)

    def write_curves(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(curves_data(self.calibration.reliability(), self.calibration.risk_coverage())))


def curves_data(reliability: dict[str, Tensor], curve: dict[str, Tensor]) -> dict[str, dict[str, list[float | None]]]:
    """The figures' data as JSON-ready lists (NaN as None): ``reliability`` (``Calibration.reliability``) and
    ``risk_coverage`` (``Calibration.risk_coverage``, thinned to the points nearest ``CURVE_POINTS`` coverages)."""
    coverage = curve["coverage"]
    if len(coverage) > CURVE_POINTS:
        grid = torch.linspace(0, 1, CURVE_POINTS, dtype=coverage.dtype)
        keep = torch.unique(torch.searchsorted(coverage, grid).clamp(max=len(coverage) - 1))
        curve = {key: values[keep] for key, values in curve.items()}
    return {name: {key: [None if math.isnan(v) else v for v in values.tolist()] for key, values in data.items()}
            for name, data in (("reliability", reliability), ("risk_coverage", curve))}

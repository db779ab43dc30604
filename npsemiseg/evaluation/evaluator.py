"""``evaluate``: every metric of the paper for one model over a dataset, in one pass."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import Dataset

from npsemiseg.evaluation.calibration import Calibration
from npsemiseg.evaluation.inference import DEFAULT_CROP_SIZE, center_crop, predict
from npsemiseg.evaluation.metrics import ConfusionMatrix, PAvPU, all_reduce_sum
from npsemiseg.evaluation.visualize import save_png, save_reliability_diagram, stack_panels, uncertainty_panel
from npsemiseg.constants import IGNORE_INDEX


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
    model: nn.Module,
    data: Dataset | Iterable[dict[str, Tensor]],
    *,
    num_classes: int,
    mode: str = "whole",
    num_samples: int | None = None,
    crop_size: int | tuple[int, int] | None = None,
    stride: int | None = None,
    class_names: Sequence[str] | None = None,
    max_images: int | None = None,
    distributed: bool | None = None,
    ignore_index: int = IGNORE_INDEX,
    pavpu_window: int = 64,
    pavpu_accuracy_threshold: float = 0.5,
    pavpu_uncertainty_threshold: float = 0.4,
    ece_bins: int = 15,
    figure_dir: str | Path | None = None,
    num_figures: int = 0,
    **predict_options: Any,
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
    log K, same thresholds), ``ece``, ``nll``, ``brier``, ``auroc``, ``num_images`` and
    ``seconds_per_image`` (prediction time, averaged over ranks). With ``figure_dir``, rank 0
    writes there ``reliability.png`` and, for ``num_figures`` > 0, ``uncertainty_maps.png``: one row
    per image (the first ``num_figures`` it evaluated) of image, ground truth, prediction, entropy.
    """
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"class_names: expected {num_classes} names, got {len(class_names)}")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images: expected >= 1 or None, got {max_images}")
    rank, world_size, distributed = _rank_and_world(distributed)
    device = _model_device(model)
    confusion = ConfusionMatrix(num_classes, ignore_index)
    pavpu_kwargs = dict(
        window=pavpu_window,
        accuracy_threshold=pavpu_accuracy_threshold,
        uncertainty_threshold=pavpu_uncertainty_threshold,
        ignore_index=ignore_index,
    )
    patches = [PAvPU(num_classes, normalize=False, **pavpu_kwargs), PAvPU(num_classes, normalize=True, **pavpu_kwargs)]
    calibration = Calibration(num_classes, num_bins=ece_bins, ignore_index=ignore_index)
    num_panels = num_figures if figure_dir is not None and rank == 0 else 0
    panels: list[Any] = []

    evaluated_crop = DEFAULT_CROP_SIZE if crop_size is None else crop_size
    was_training = model.training
    model.eval()
    num_images, seconds = 0, 0.0
    try:
        for images, labels in _batches(data, rank, world_size, max_images):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True).long()
            if mode == "center_crop":
                images_shown = center_crop(images, evaluated_crop)
                labels = center_crop(labels, evaluated_crop)
            else:
                images_shown = images
            start = time.perf_counter()
            probs, entropy = predict(
                model, images, mode=mode, num_samples=num_samples, crop_size=crop_size, stride=stride,
                **predict_options,
            )
            seconds += time.perf_counter() - start
            if probs.shape[-2:] != labels.shape[-2:]:
                raise ValueError(
                    f"data: labels of size {tuple(labels.shape[-2:])} do not match the predicted "
                    f"{tuple(probs.shape[-2:])} (mode {mode!r})"
                )
            prediction = probs.argmax(dim=1)
            confusion.update(prediction, labels)
            for accumulator in patches:
                accumulator.update(prediction, labels, entropy)
            calibration.update(probs, labels, entropy)
            for i in range(min(num_panels - len(panels), images.shape[0])):
                panels.append(
                    uncertainty_panel(
                        images_shown[i], prediction[i], labels[i], entropy[i], num_classes=num_classes,
                        ignore_index=ignore_index,
                    )
                )
            num_images += images.shape[0]
    finally:
        model.train(was_training)

    if distributed:
        for accumulator in (confusion, *patches, calibration):
            accumulator.all_reduce()
        totals = all_reduce_sum(torch.tensor([float(num_images), seconds], dtype=torch.float64))
        num_images, seconds = int(totals[0].item()), float(totals[1].item())
    if num_images == 0:
        raise ValueError("data: no image to evaluate (empty dataset or loader)")

    segmentation = confusion.compute()
    metrics: dict[str, float] = {"miou": segmentation["miou"], "pixel_acc": segmentation["pixel_acc"]}
    for k, iou in enumerate(segmentation["per_class_iou"].tolist()):
        metrics[f"iou/{class_names[k] if class_names is not None else k}"] = iou
    for accumulator in patches:
        metrics.update(accumulator.compute())
    metrics.update(calibration.compute())
    metrics["num_images"] = float(num_images)
    metrics["seconds_per_image"] = seconds / num_images
    if figure_dir is not None and rank == 0:
        if panels:
            save_png(Path(figure_dir) / "uncertainty_maps.png", stack_panels(panels))
        save_reliability_diagram(Path(figure_dir) / "reliability.png", calibration.reliability())
    return metrics

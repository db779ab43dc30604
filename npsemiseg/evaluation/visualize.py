"""Figures: uncertainty maps next to image, ground truth and prediction; reliability diagrams.

The uncertainty map is the entropy of the mean prediction in grey scale, as in
the paper's appendix: black = certain (0 nats), white = the maximum ``log K``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image, PngImagePlugin
from torch import Tensor

from npsemiseg.constants import IGNORE_INDEX

#: Cityscapes' 19 train-id colours (cityscapesScripts' labels.py)
CITYSCAPES_PALETTE = (
    (128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153), (153, 153, 153),
    (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152), (70, 130, 180), (220, 20, 60),
    (255, 0, 0), (0, 0, 142), (0, 0, 70), (0, 60, 100), (0, 80, 100), (0, 0, 230), (119, 11, 32),
)  # fmt: skip

#: colour of ignored (255) label pixels: VOC's boundary colour
IGNORE_COLOUR = (224, 224, 192)


def voc_palette(num_colors: int = 256) -> np.ndarray:
    """PASCAL VOC's colour map (bit-interleaved class index), ``uint8 [num_colors, 3]``."""
    palette = np.zeros((num_colors, 3), dtype=np.uint8)
    for index in range(num_colors):
        value, r, g, b = index, 0, 0, 0
        for bit in range(8):
            r |= ((value >> 0) & 1) << (7 - bit)
            g |= ((value >> 1) & 1) << (7 - bit)
            b |= ((value >> 2) & 1) << (7 - bit)
            value >>= 3
        palette[index] = (r, g, b)
    return palette


def colorize(label: Tensor, palette: np.ndarray | None = None, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """Class map ``[H, W]`` -> ``uint8 [H, W, 3]`` (``palette`` default: VOC's), ignored pixels in
    ``IGNORE_COLOUR``."""
    if label.dim() != 2:
        raise ValueError(f"label: expected [H, W], got shape {tuple(label.shape)}")
    palette = voc_palette() if palette is None else np.asarray(palette, dtype=np.uint8)
    values = label.detach().cpu().long().numpy()
    ignored = values == ignore_index
    if (values[~ignored] >= len(palette)).any() or (values[~ignored] < 0).any():
        raise ValueError(f"label: classes must lie in [0, {len(palette)}) (the palette) or be {ignore_index}")
    out = palette[np.where(ignored, 0, values)]
    out[ignored] = IGNORE_COLOUR
    return out


def palette_for(num_classes: int) -> np.ndarray:
    """The colours of ``num_classes`` classes: Cityscapes' train-id colours for 19, else VOC's, ``uint8 [256, 3]``."""
    palette = voc_palette()
    if num_classes == len(CITYSCAPES_PALETTE):
        palette[: num_classes] = np.asarray(CITYSCAPES_PALETTE, dtype=np.uint8)
    return palette


def save_label_png(path: str | Path, label: Tensor, num_classes: int) -> Path:
    """Write a class map ``[H, W]`` as a palette PNG: pixel values are the class indices (0..K-1),
    shown in ``palette_for(K)``'s colours. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = label.detach().cpu().to(torch.uint8).numpy()
    image = Image.frombytes("P", (values.shape[1], values.shape[0]), values.tobytes())
    image.putpalette(palette_for(num_classes).reshape(-1).tolist())
    image.save(path)
    return path


def save_uncertainty_png(path: str | Path, entropy: Tensor, num_classes: int) -> Path:
    """Write an entropy map ``[H, W]`` (nats) as a grey PNG (``entropy_to_grey``: 0 = certain, 255 =
    log K) with its scale in the PNG's text chunk (``uncertainty_scale``, ``max_nats``). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = PngImagePlugin.PngInfo()
    info.add_text("uncertainty_scale", f"entropy of the mean prediction: grey 0 = 0 nats, 255 = log {num_classes} = "
                                       f"{math.log(num_classes):.4f} nats (linear)")
    info.add_text("max_nats", f"{math.log(num_classes):.6f}")
    Image.fromarray(entropy_to_grey(entropy, num_classes)).save(path, pnginfo=info)
    return path


def overlay(image: Tensor, label: Tensor, num_classes: int, alpha: float = 0.5) -> np.ndarray:
    """``image [3, H, W]`` in [0, 1] blended with the colours of ``label [H, W]``: ``uint8 [H, W, 3]``."""
    rgb = image.detach().float().cpu().clamp(0, 1).permute(1, 2, 0).numpy() * 255
    colours = colorize(label, palette_for(num_classes)).astype(np.float32)
    return np.round((1 - alpha) * rgb + alpha * colours).astype(np.uint8)


def entropy_to_grey(entropy: Tensor, num_classes: int) -> np.ndarray:
    """Entropy map ``[H, W]`` (nats) -> ``uint8 [H, W]``, 0 = certain, 255 = ``log K``."""
    scaled = (entropy.detach().float().cpu() / math.log(num_classes)).clamp(0, 1) * 255
    return scaled.round().to(torch.uint8).numpy()


def uncertainty_panel(
    image: Tensor,
    prediction: Tensor,
    target: Tensor,
    entropy: Tensor,
    *,
    num_classes: int,
    palette: np.ndarray | None = None,
    ignore_index: int = IGNORE_INDEX,
    gap: int = 4,
) -> np.ndarray:
    """``uint8 [H, 4W + 3 gap, 3]``: image, ground truth, prediction, entropy (grey), left to right.

    image ``[3, H, W]`` in [0, 1]; prediction, target ``[H, W]``; entropy ``[H, W]`` in nats.
    """
    if image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"image: expected [3, H, W], got shape {tuple(image.shape)}")
    size = tuple(image.shape[-2:])
    for name, tensor in (("prediction", prediction), ("target", target), ("entropy", entropy)):
        if tuple(tensor.shape) != size:
            raise ValueError(f"{name}: expected shape {size} (the image's), got {tuple(tensor.shape)}")
    if palette is None and num_classes == len(CITYSCAPES_PALETTE):
        palette = np.asarray(CITYSCAPES_PALETTE, dtype=np.uint8)
    rgb = (image.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    grey = np.repeat(entropy_to_grey(entropy, num_classes)[..., None], 3, axis=2)
    panels = [rgb, colorize(target, palette, ignore_index), colorize(prediction, palette, ignore_index), grey]
    spacer = np.full((size[0], gap, 3), 255, dtype=np.uint8)
    row = [panels[0]]
    for panel in panels[1:]:
        row += [spacer, panel]
    return np.concatenate(row, axis=1)


def stack_panels(panels: list[np.ndarray], gap: int = 4) -> np.ndarray:
    """Stack ``uint8 [H_i, W_i, 3]`` panels top to bottom, ``gap`` white rows between them, each
    left-aligned on a white background as wide as the widest."""
    if not panels:
        raise ValueError("panels: expected at least one panel to stack")
    width = max(panel.shape[1] for panel in panels)
    rows = []
    for index, panel in enumerate(panels):
        if index:
            rows.append(np.full((gap, width, 3), 255, dtype=np.uint8))
        row = np.full((panel.shape[0], width, 3), 255, dtype=np.uint8)
        row[:, : panel.shape[1]] = panel
        rows.append(row)
    return np.concatenate(rows, axis=0)


def save_png(path: str | Path, pixels: np.ndarray) -> Path:
    """Write ``uint8 [H, W, 3]`` pixels as a PNG at ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def save_uncertainty_figure(
    path: str | Path,
    image: Tensor,
    prediction: Tensor,
    target: Tensor,
    entropy: Tensor,
    *,
    num_classes: int,
    palette: np.ndarray | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> Path:
    """Write ``uncertainty_panel(...)`` of one image as a PNG at ``path``; returns the path."""
    panel = uncertainty_panel(
        image, prediction, target, entropy, num_classes=num_classes, palette=palette, ignore_index=ignore_index
    )
    return save_png(path, panel)


def save_reliability_diagram(path: str | Path, reliability: dict[str, Tensor], *, title: str | None = None) -> Path:
    """Reliability diagram (accuracy per confidence bin against the diagonal, with the pixel share
    per bin) from ``Calibration.reliability()``, as a PNG at ``path``; returns the path."""
    # heavy (~0.3 s to import), needed only when figures are asked for; no pyplot: no global backend state
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lower, upper = reliability["lower"].numpy(), reliability["upper"].numpy()
    count = reliability["count"].numpy()
    accuracy = np.nan_to_num(reliability["accuracy"].numpy(), nan=0.0)
    confidence = reliability["confidence"].numpy()
    centers, width = (lower + upper) / 2, upper - lower
    figure = Figure(figsize=(4, 5))
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(centers, accuracy, width=width, edgecolor="black", label="accuracy")
    top.plot(centers, np.where(count > 0, confidence, np.nan), "o", color="tab:red", ms=3, label="mean confidence")
    top.plot([0, 1], [0, 1], "--", color="grey")
    top.set(ylabel="accuracy", xlim=(0, 1), ylim=(0, 1), title=title or "reliability")
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(centers, count / max(count.sum(), 1), width=width, edgecolor="black", color="tab:grey")
    bottom.set(xlabel="confidence (max probability)", ylabel="pixels")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path


def save_risk_coverage_plot(path: str | Path, curve: dict[str, Tensor], *, title: str | None = None) -> Path:
    """Risk-coverage curve (error rate among the pixels kept, most certain first, against the share kept) from
    ``Calibration.risk_coverage()``, with the overall error rate as a dashed line, as a PNG at ``path``."""
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    coverage, risk = curve["coverage"].numpy(), curve["risk"].numpy()
    figure = Figure(figsize=(4, 3.5))
    axes = figure.subplots()
    axes.step(np.concatenate([[0.0], coverage]), np.concatenate([[risk[0] if len(risk) else 0.0], risk]),
              where="pre", color="tab:blue")
    if len(risk):
        axes.axhline(risk[-1], linestyle="--", color="grey", linewidth=0.8, label="error rate, all pixels")
        axes.legend(loc="upper left", fontsize=8)
    axes.set(xlabel="coverage (share of pixels kept, most certain first)", ylabel="risk (error rate of kept)",
             xlim=(0, 1), ylim=(0, None), title=title or "risk-coverage")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path

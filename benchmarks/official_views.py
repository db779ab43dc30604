"""What the official UniMatch pipeline and the project's deliver on the unlabeled stream, compared view by view.

The whole runs of ``official_runs.py`` differ for UniMatch where the supervised ones do not; what differs between the
two pipelines on the unlabeled stream and not on the labeled one is the strong views: the official code draws them on
the JPEG-decoded uint8 crop with PIL (``ColorJitter``, ``RandomGrayscale``, ``GaussianBlur(radius=sigma)``), the project
on the float crop; and both draw them on a crop already padded, the official one padded with 0 (black), the project's
with the ImageNet mean (deviation D18), so the padding enters the colour jitter's contrast mean and the blur.

This draws ``--items`` unlabeled items (the mini study's data of ``--data-seed``, exported in the official layout as
``official_runs.py`` does) through three pipelines:

- ``official``: UniMatch@0324f3d ``dataset/semi.py``'s ``SemiDataset(mode="train_u")``, imported from the checkout
  under ``--official-root`` (nothing of it copied), on the exported JPEGs;
- ``project``: the project's unlabeled transform of the ``official_runs.py`` cell (``train_transforms``) with the crop's
  image padded with the ImageNet mean (``data.augmentation.crop_fill: mean``, the corrected fill; the released cell
  pads with black since 2026-11-29, switch ``crop_fill``);
- ``project_fill0``: the same with the crop's image padded with 0 (``crop_fill: zero``, the official fill, D18;
  nothing else),

and writes ``--out/official_views.json``: per pipeline, over the strong views' pixels in [0, 1] RGB (each item's two
strong views), split by where they lie: ``valid`` (not padded), ``valid_unpadded_items`` (items without padding: the
photometric implementations alone), ``valid_padded_items`` (valid pixels of padded items), ``edge`` (valid pixels
within 3 px of the padding) and ``padding``; for each the mean, the std, the mean of strong minus weak and the mean
absolute change from the weak view (and its mean over items with the standard error); and the fraction of padded
pixels and padded items. Every pipeline is seeded with
``--seed`` (``random``, numpy, torch).

    python benchmarks/official_views.py --official-root ROOT --data-seed 0 --items 960 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as nnf

from npsemiseg.training.factories import build_datasets, train_transforms

from official.patching import seed_everything
from official.report import provenance
from official.study import OFFICIAL, export_official_layout, project_config, study_config
from official_side_by_side import IMAGENET_MEAN, IMAGENET_STD, checkout, official_imports

PIPELINES = ("official", "project", "project_fill0")
REGIONS = ("valid", "valid_unpadded_items", "valid_padded_items", "edge", "padding")
EDGE_PIXELS = 3

#: (weak [3, H, W], strong views [V, 3, H, W], padding [H, W] bool), images in [0, 1]
Views = tuple[Tensor, Tensor, Tensor]


def _unnormalise(image: Tensor) -> Tensor:
    return image * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)


@contextlib.contextmanager
def official_views(folder: Path, root: Path, unlabeled: Path, crop: int) -> Iterator[Callable[[int], Views]]:
    """Item ``i`` of the official ``SemiDataset('study', root, 'train_u', crop, unlabeled)`` as :data:`Views` (the
    ImageNet normalisation undone; padding = ``ignore_mask == 255``)."""
    with official_imports(folder), contextlib.chdir(root):
        from dataset.semi import SemiDataset  # the official checkout's, on sys.path only here

        dataset = SemiDataset("study", str(root), "train_u", crop, str(unlabeled))

        def draw(i: int) -> Views:
            weak, strong1, strong2, ignore, _, _ = dataset[i % len(dataset)]
            return _unnormalise(weak), torch.stack([_unnormalise(strong1), _unnormalise(strong2)]), ignore == 255

        yield draw


def project_views(data_seed: int, seed: int, crop_fill: str = "mean") -> Callable[[int], Views]:
    """Item ``i`` of the project's unlabeled stream of the ``official_runs.py`` UniMatch cell as :data:`Views`, the
    crop's image padded with ``crop_fill`` (``data.augmentation.crop_fill``: ``mean`` or ``zero``)."""
    config = project_config("unimatch", data_seed, seed, overrides={"data.augmentation.crop_fill": crop_fill})
    dataset = build_datasets(config)["unlabeled"]
    transform = train_transforms(config)["unlabeled"]

    def draw(i: int) -> Views:
        item = transform(dataset[i % len(dataset)])
        return item["image"], torch.stack([item["image_strong"], item["image_strong2"]]), item["padding"]

    return draw


def region_masks(padding: Tensor) -> dict[str, Tensor]:
    """The :data:`REGIONS` of one item's pixels (``[H, W]`` bool each)."""
    valid = ~padding
    padded = bool(padding.any())
    near = nnf.max_pool2d(padding[None, None].float(), 2 * EDGE_PIXELS + 1, stride=1, padding=EDGE_PIXELS)[0, 0] > 0
    return {"valid": valid, "valid_unpadded_items": valid if not padded else torch.zeros_like(valid),
            "valid_padded_items": valid if padded else torch.zeros_like(valid), "edge": valid & near,
            "padding": padding}


def statistics(draw: Callable[[int], Views], items: int) -> dict[str, Any]:
    """:data:`REGIONS` statistics of the strong views over ``items`` draws (module docstring)."""
    sums = {r: torch.zeros(4, 3, dtype=torch.float64) for r in REGIONS}  # sum, sum of squares, strong - weak, |.|
    counts = dict.fromkeys(REGIONS, 0)
    per_item: dict[str, list[float]] = {r: [] for r in REGIONS}  # each item's mean |strong - weak| (its spread)
    padded_pixels = padded_items = total_pixels = 0
    for i in range(items):
        weak, strong, padding = draw(i)
        padded_pixels += int(padding.sum())
        padded_items += bool(padding.any())
        total_pixels += padding.numel()
        for region, mask in region_masks(padding).items():
            s = strong[:, :, mask].permute(1, 0, 2).reshape(3, -1).double()  # [3, V x pixels]
            w = weak[:, mask].double().repeat(1, strong.shape[0])
            sums[region] += torch.stack([s.sum(1), (s * s).sum(1), (s - w).sum(1), (s - w).abs().sum(1)])
            counts[region] += s.shape[1]
            if s.numel():
                per_item[region].append(float((s - w).abs().mean()))
    out: dict[str, Any] = {"items": items, "padded_pixel_fraction": padded_pixels / total_pixels,
                           "padded_item_fraction": padded_items / items}
    out["regions"] = {r: region_summary(sums[r], counts[r], per_item[r]) for r in REGIONS}
    return out


def region_summary(sums: Tensor, count: int, per_item: list[float]) -> dict[str, Any]:
    """One region's mean, std, mean strong - weak and mean |strong - weak| per channel (``sums``: their sums over
    ``count`` pixels) and the items' mean |strong - weak| (``per_item``) with its standard error."""
    n = max(count, 1)
    mean = sums[0] / n
    spread = float(np.std(per_item, ddof=1) / np.sqrt(len(per_item))) if len(per_item) > 1 else float("nan")
    return {"pixels": count, "mean": mean.tolist(), "std": (sums[1] / n - mean ** 2).clamp_min(0).sqrt().tolist(),
            "strong_minus_weak": (sums[2] / n).tolist(), "abs_change": (sums[3] / n).tolist(),
            "abs_change_item_mean": float(np.mean(per_item)) if per_item else float("nan"), "abs_change_item_se": spread}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, required=True, help="folder of <owner>+<repo> checkouts")
    parser.add_argument("--data-seed", type=int, default=0, help="the study dataset's instance")
    parser.add_argument("--seed", type=int, default=0, help="the draws' seed (random, numpy, torch)")
    parser.add_argument("--items", type=int, default=960, help="unlabeled items drawn per pipeline (cycling the pool)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.items < 1:
        parser.error(f"--items: expected a positive count, got {args.items}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    folder = checkout(args.official_root, OFFICIAL["unimatch"][0])
    torch.set_num_threads(1)
    lists = export_official_layout(study_config(args.data_seed), args.out / "work" / "data")
    crop = project_config("unimatch", args.data_seed, args.seed).schedule.crop_size
    results: dict[str, Any] = {}
    seed_everything(args.seed)
    with official_views(folder, lists["val"].parents[2], lists["unlabeled"], crop) as draw:
        results["official"] = statistics(draw, args.items)
    for name, fill in (("project", "mean"), ("project_fill0", "zero")):
        seed_everything(args.seed)
        results[name] = statistics(project_views(args.data_seed, args.seed, fill), args.items)
    report = {"data_seed": args.data_seed, "seed": args.seed, "pipelines": results,
              **provenance("official_views.py", sys.argv[1:] if argv is None else argv)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "official_views.json").write_text(json.dumps(report, indent=1) + "\n")
    for name, result in results.items():
        print(name, f"padded pixels {result['padded_pixel_fraction']:.3f}, items {result['padded_item_fraction']:.3f}")
        for region, r in result["regions"].items():
            print(f"  {region:22s} mean {np.round(r['mean'], 3)} std {np.round(r['std'], 3)} "
                  f"s-w {np.round(r['strong_minus_weak'], 3)} |s-w| {np.round(r['abs_change'], 3)} "
                  f"(items {r['abs_change_item_mean']:.4f} +- {r['abs_change_item_se']:.4f})")
    return report


if __name__ == "__main__":
    main()

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

``--framework fixmatch_v2`` compares UniMatch V2@f6afb4d's ``SemiDataset`` (the same transforms; its ``train_u`` reads
no label) with the project's pipeline of that framework's cell (the mini ViT's crop) instead. ``--checkpoint`` adds
what one trained network makes of each pipeline's views (:func:`network_statistics`: FixMatch's mask ratio and its
unsupervised loss with and without CutMix, the strong view's agreement with the weak one), the network being the
project's of the cell with the weights of an official run's checkpoint (:func:`checkpoint_network`). Item ``i`` of
every pipeline is the same image (the export lists the unlabeled images in the project's order), so each measure's
difference from the official pipeline is also tested item by item (paired).

    python benchmarks/official_views.py --official-root ROOT --data-seed 0 --items 960 --out DIR
    python benchmarks/official_views.py --official-root ROOT --framework fixmatch_v2 --items 960 \
        --checkpoint RUN/work/fixmatch_v2_1/best.pth --out DIR      # RUN: an official_runs.py --side official run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import Tensor, nn
from torch.nn import functional as nnf

from npsemiseg.data.transforms import strong_key
from npsemiseg.frameworks import get_framework
from npsemiseg.frameworks.fixmatch import unimatch_boxes
from npsemiseg.models import upsample_logits
from npsemiseg.training.factories import build_datasets, train_transforms

from official.networks import initial_network
from official.patching import seed_everything
from official.report import provenance
from official.study import OFFICIAL, export_official_layout, project_config, study_config
from official_side_by_side import IMAGENET_MEAN, IMAGENET_STD, checkout, official_imports

PIPELINES = ("official", "project", "project_fill0")
#: the frameworks whose official ``SemiDataset`` this draws, each beside its ``official_runs.py`` cell's pipeline
FRAMEWORKS = ("unimatch", "fixmatch_v2")
#: what :func:`network_statistics` measures per item
NETWORK_MEASURES = ("mask_ratio", "loss", "agreement", "mask_ratio_mixed", "loss_mixed")
REGIONS = ("valid", "valid_unpadded_items", "valid_padded_items", "edge", "padding")
EDGE_PIXELS = 3

#: (weak [3, H, W], strong views [V, 3, H, W], padding [H, W] bool), images in [0, 1]
Views = tuple[Tensor, Tensor, Tensor]


def _unnormalise(image: Tensor) -> Tensor:
    return image * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)


@contextlib.contextmanager
def official_views(folder: Path, root: Path, unlabeled: Path, crop: int,
                   strong_views: int = 2) -> Iterator[Callable[[int], Views]]:
    """Item ``i`` of the official ``SemiDataset('study', root, 'train_u', crop, unlabeled)`` as :data:`Views` (the
    ImageNet normalisation undone; padding = ``ignore_mask == 255``): its first ``strong_views`` strong views (it draws
    two; FixMatch's loop reads the first)."""
    with official_imports(folder), contextlib.chdir(root):
        from dataset.semi import SemiDataset  # the official checkout's, on sys.path only here

        dataset = SemiDataset("study", str(root), "train_u", crop, str(unlabeled))

        def draw(i: int) -> Views:
            weak, strong1, strong2, ignore, _, _ = dataset[i % len(dataset)]
            strong = torch.stack([_unnormalise(strong1), _unnormalise(strong2)])[:strong_views]
            return _unnormalise(weak), strong, ignore == 255

        yield draw


def project_views(data_seed: int, seed: int, crop_fill: str = "mean", framework: str = "unimatch") -> Callable[[int], Views]:
    """Item ``i`` of the project's unlabeled stream of ``framework``'s ``official_runs.py`` cell as :data:`Views`, the
    crop's image padded with ``crop_fill`` (``data.augmentation.crop_fill``: ``mean`` or ``zero``); its strong views
    (UniMatch's cell makes two, FixMatch V2's one)."""
    config = project_config(framework, data_seed, seed, overrides={"data.augmentation.crop_fill": crop_fill})
    dataset = build_datasets(config)["unlabeled"]
    transform = train_transforms(config)["unlabeled"]

    def draw(i: int) -> Views:
        item = transform(dataset[i % len(dataset)])
        strong = [item[key] for key in map(strong_key, range(len(item))) if key in item]
        return item["image"], torch.stack(strong), item["padding"]

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


def checkpoint_network(framework: str, data_seed: int, seed: int, checkpoint: Path) -> nn.Module:
    """The project's network of ``framework``'s ``official_runs.py`` cell with the weights of an official run's
    ``checkpoint`` (the script's ``best.pth``: its ``model_ema``, else ``model``; the official side's model holds the
    project's network as ``student``, wrapped by DDP as ``module``), in eval mode."""
    network = initial_network(project_config(framework, data_seed, seed))
    # read as data (tensors and plain values): state dicts, the epoch and the best mIoUs, NumPy float64 scalars
    with torch.serialization.safe_globals([np._core.multiarray.scalar, np.dtype, np.dtypes.Float64DType]):
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state, prefix = saved["model_ema"] if "model_ema" in saved else saved["model"], "module.student."
    network.load_state_dict({key.removeprefix(prefix): value for key, value in state.items() if key.startswith(prefix)})
    return network.eval()


@torch.no_grad()
def network_statistics(draw: Callable[[int], Views], items: int, network: nn.Module, threshold: float,
                       batch: int = 8, box_seed: int = 0) -> dict[str, list[float]]:
    """What a trained ``network`` makes of one pipeline's views, per item (each measure ``[items]``; the first strong
    view): ``mask_ratio``, the share of the weak view's valid pixels whose confidence reaches ``threshold``
    (FixMatch's mask); ``loss``, the strong view's cross-entropy against the weak view's classes summed over those
    pixels over the valid ones (FixMatch's unsupervised term); ``agreement``, the share of valid pixels whose
    strong-view class is the weak view's; ``mask_ratio_mixed`` and ``loss_mixed``, the same after CutMix as UniMatch
    V2's loops mix (batches of ``batch``, the flipped batch pasted into :func:`unimatch_boxes` drawn from
    ``random.Random(box_seed)``: the same boxes for every pipeline)."""
    def logits(images: Tensor) -> Tensor:
        return upsample_logits(network(images).head.logits, images.shape[-2:], align_corners=True)[0]

    rng, out = random.Random(box_seed), {name: [] for name in NETWORK_MEASURES}
    for start in range(0, items, batch):
        weak, strong, padding = (torch.stack(parts) for parts in zip(*map(draw, range(start, min(start + batch, items)))))
        strong, valid = strong[:, 0], ~padding
        confidence, label = logits(weak).softmax(1).max(1)
        strong_logits = logits(strong)
        boxes = unimatch_boxes(weak.shape[0], *weak.shape[-2:], rng=rng)
        mixed = logits(torch.where(boxes[:, None], strong.flip(0), strong))
        mixed_label, mixed_confidence, mixed_valid = (torch.where(boxes, t.flip(0), t) for t in (label, confidence, valid))
        for name, (view_logits, target, conf, kept) in {
                "": (strong_logits, label, confidence, valid),
                "_mixed": (mixed, mixed_label, mixed_confidence, mixed_valid)}.items():
            loss = nnf.cross_entropy(view_logits, target, reduction="none")
            masked = (conf >= threshold) & kept
            count = kept.flatten(1).sum(1).clamp_min(1)
            out[f"mask_ratio{name}"] += (masked.flatten(1).sum(1) / count).tolist()
            out[f"loss{name}"] += ((loss * masked).flatten(1).sum(1) / count).tolist()
        agree = (strong_logits.argmax(1) == label) & valid
        out["agreement"] += (agree.flatten(1).sum(1) / valid.flatten(1).sum(1).clamp_min(1)).tolist()
    return out


def network_summary(measures: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Per measure: each pipeline's mean and standard error over items, and each project pipeline's difference from
    the official one with its paired (item by item) t-test's p-value."""
    out: dict[str, dict[str, Any]] = {}
    for name in NETWORK_MEASURES:
        values = {pipeline: np.array(m[name]) for pipeline, m in measures.items()}
        out[name] = {pipeline: {"mean": float(v.mean()), "se": float(v.std(ddof=1) / np.sqrt(len(v)))}
                     for pipeline, v in values.items()}
        for pipeline, v in values.items():
            if pipeline != "official":
                out[name][pipeline].update(minus_official=float((v - values["official"]).mean()),
                                           paired_p=float(stats.ttest_rel(v, values["official"]).pvalue))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, required=True, help="folder of <owner>+<repo> checkouts")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="unimatch",
                        help="whose SemiDataset and official_runs.py cell (default: UniMatch's)")
    parser.add_argument("--data-seed", type=int, default=0, help="the study dataset's instance")
    parser.add_argument("--seed", type=int, default=0, help="the draws' seed (random, numpy, torch)")
    parser.add_argument("--items", type=int, default=960, help="unlabeled items drawn per pipeline (cycling the pool)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="an official run's best.pth of --framework: also measure its network on the views")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.items < 1:
        parser.error(f"--items: expected a positive count, got {args.items}")
    if args.checkpoint is not None and not args.checkpoint.is_file():
        parser.error(f"--checkpoint: {args.checkpoint} is not a file (expected an official run's best.pth)")
    return args


def drawn(draw: Callable[[int], Views], items: int, seed: int) -> list[Views]:
    """``items`` draws of a pipeline, every RNG seeded with ``seed`` first (kept, so that each measure reads the same
    views)."""
    seed_everything(seed)
    return [draw(i) for i in range(items)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    folder = checkout(args.official_root, OFFICIAL[args.framework][0])
    torch.set_num_threads(1)
    lists = export_official_layout(study_config(args.data_seed), args.out / "work" / "data")
    config = project_config(args.framework, args.data_seed, args.seed)
    network = None if args.checkpoint is None else \
        checkpoint_network(args.framework, args.data_seed, args.seed, args.checkpoint)
    threshold = config.framework_options["confidence_threshold"]
    results: dict[str, Any] = {}
    measures: dict[str, dict[str, list[float]]] = {}

    def measure(name: str, draw: Callable[[int], Views]) -> None:  # one pipeline's views held at a time
        views = drawn(draw, args.items, args.seed)
        results[name] = statistics(views.__getitem__, args.items)
        if network is not None:
            measures[name] = network_statistics(views.__getitem__, args.items, network, threshold)

    # the cell's strong views per item, as its pipeline is built (npsemiseg.training.factories.train_transforms)
    strong_views = get_framework(config.framework).unlabeled_views(config.framework_options).get("strong_views", 1)
    with official_views(folder, lists["val"].parents[2], lists["unlabeled"], config.schedule.crop_size,
                        strong_views=strong_views) as draw:
        measure("official", draw)
    for name, fill in (("project", "mean"), ("project_fill0", "zero")):
        measure(name, project_views(args.data_seed, args.seed, fill, args.framework))
    report = {"framework": args.framework, "data_seed": args.data_seed, "seed": args.seed, "pipelines": results}
    if network is not None:
        report["network"] = {"checkpoint": str(args.checkpoint), "threshold": threshold,
                             "measures": network_summary(measures)}
    report.update(provenance("official_views.py", sys.argv[1:] if argv is None else argv))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "official_views.json").write_text(json.dumps(report, indent=1) + "\n")
    for name, result in results.items():
        print(name, f"padded pixels {result['padded_pixel_fraction']:.3f}, items {result['padded_item_fraction']:.3f}")
        for region, r in result["regions"].items():
            print(f"  {region:22s} mean {np.round(r['mean'], 3)} std {np.round(r['std'], 3)} "
                  f"s-w {np.round(r['strong_minus_weak'], 3)} |s-w| {np.round(r['abs_change'], 3)} "
                  f"(items {r['abs_change_item_mean']:.4f} +- {r['abs_change_item_se']:.4f})")
    for measure, table in report.get("network", {}).get("measures", {}).items():
        print(measure, "  ".join(f"{name} {v['mean']:.4f} +- {v['se']:.4f}" + (
            f" ({v['minus_official']:+.4f}, paired p {v['paired_p']:.3f})" if "paired_p" in v else "")
            for name, v in table.items()))
    return report


if __name__ == "__main__":
    main()

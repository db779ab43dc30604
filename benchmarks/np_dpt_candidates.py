"""Where the NP head reads UniMatch V2's DPT: the candidate designs side by side, on CPU, in one run.

The DPT hands the heads its map at 8x the patch grid (296 x 296 at crop 518) and the NP decoder runs its T samples
there. Candidates (``docs/vit.md``, "Where the NP head reads the DPT"):

- ``baseline``: the baseline head (U2PL's classifier block), the reference of every ratio;
- ``np_today``: the NP head on the map as it is (``feature_pool=1``, the ``released`` rule), its decoder's
  latent-independent first conv once for all samples (``impl="split"``), one sample per convolution call (CPU);
- ``np_batched``: the same with the T samples batched through one convolution call (``samples_per_conv=T``);
- ``np_pool2`` / ``np_pool4`` / ``np_pool8``: the NP head on the map averaged over 2 / 4 / 8 cells (the DPT's
  1/3.5, 1/7 and 1/14 maps), its logits upsampled after it (``feature_pool``; 4 is the ``corrected`` default);
- ``np_shared_full``: the latent-independent part (small ConvNet, the decoder's first conv on the features) at
  full resolution once, only the T-sample part (first conv's constant maps, norms, second conv, classifier) on the
  1/7 grid: the first conv's output averaged over 4 x 4 cells.

Parts (each writes into the JSON as it ends; ``--parts``, in this order):

1. ``step``: UniMatch V2's whole training step (``gpu_acceptance.compose_cell``, ``setup_run``, ``train_step``: the
   project's loop) at crop 518 on DINOv2-S (random init), ``--step-batch`` labeled + as many unlabeled images, for
   the baseline head and the ``corrected`` NP default (``--step-today``: also the NP head on the full map): one step
   each under the FLOP counter, its FLOPs, peak RSS and time.
2. ``head``: per DINOv2 width (S: 64 DPT features, B: 128), one training-mode forward + backward of each
   candidate (``--candidates``) on a random post-ReLU ``[B, F, 296, 296]`` map with labels at 518 (the first image
   the context): median wall time of ``--repeats`` passes, FLOPs (``FlopCounterMode``, convolutions and matrix
   products, one more pass) and the peak resident memory above the pass's start (``VmHWM`` after ``malloc_trim``).
3. ``inference_flops``: FLOPs of T = 20 samples of one image (the DPT and the head) on the meta device, nothing
   computed: MC dropout (decoder scope) against the NP head at each ``feature_pool``.
4. ``inference``: the same T = 20 samples computed and timed (one pass each, under the FLOP counter): NP = the DPT
   once + the head with T = 20; MC dropout (decoder scope, the paper's) = 20 passes of the DPT with always-active
   dropout + the MC head (claim C5).

Times on a shared CPU are rough; FLOPs and memory are what the decision in ``docs/vit.md`` rests on.

    python benchmarks/np_dpt_candidates.py --out benchmarks/results/np_dpt_candidates
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_acceptance import (  # noqa: E402
    compose_cell,
    machine,
    parse_arguments,
    peak_memory_mib,
    reset_peak_memory,
    step_context,
)

from npsemiseg.training.setup import backend_flags, setup_run  # noqa: E402
from npsemiseg.training.step import train_step  # noqa: E402

from npsemiseg.heads import NPDecoder, build_head  # noqa: E402
from npsemiseg.models.backbones import BACKBONES  # noqa: E402
from npsemiseg.models.dpt import DPTDecoder  # noqa: E402
from npsemiseg.models.vit import ViTSpec  # noqa: E402

CROP, PATCH, NUM_CLASSES, SAMPLES, INFERENCE_SAMPLES = 518, 14, 21, 5, 20
#: candidate -> NP head options (None: the baseline head); ``np_shared_full`` swaps in :class:`SharedFullDecoder`
CANDIDATES: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "np_today": {"feature_pool": 1},
    "np_batched": {"feature_pool": 1},
    "np_pool2": {"feature_pool": 2},
    "np_pool4": {"feature_pool": 4},
    "np_pool8": {"feature_pool": 8},
    "np_shared_full": {"feature_pool": 1},
}


class SharedFullDecoder(NPDecoder):
    """The NP decoder with its latent-independent first conv on the full map and the rest on the 1/7 grid: the
    first conv's output averaged over 4 x 4 cells before the constant maps of z and r are added (candidate
    ``np_shared_full``; measured here, not offered)."""

    pool = 4

    def _split_parts(self, x: torch.Tensor, z: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        conv_x, taps = super()._split_parts(x, z, r)
        return F.avg_pool2d(conv_x, self.pool, ceil_mode=True), taps


def build_candidate(name: str, features: int) -> torch.nn.Module:
    options = CANDIDATES[name]
    if options is None:
        return build_head("baseline", features, NUM_CLASSES)
    head = build_head("np", features, NUM_CLASSES, **options)
    if name == "np_batched":
        head.decoder.samples_per_conv = SAMPLES
    if name == "np_shared_full":
        head.decoder.__class__ = SharedFullDecoder
    return head


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def head_pass(head: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor) -> None:
    """One training-mode forward + backward: every image a target, the first the context; CE on the upsampled
    logits of every sample (the frameworks' loss) plus the head's aux loss."""
    x = features.detach().requires_grad_(True)
    samples = SAMPLES if head.stochastic else None
    out = head(x, labels=labels, context_features=x[:1], context_labels=labels[:1], num_samples=samples)
    t, b = out.logits.shape[:2]
    logits = F.interpolate(out.logits.flatten(0, 1), size=labels.shape[-2:], mode="bilinear")
    loss = F.cross_entropy(logits, labels.repeat(t, 1, 1), ignore_index=255) + out.aux_loss
    loss.backward()


def measure_heads(backbone: str, batch: int, repeats: int) -> list[dict[str, Any]]:
    spec = BACKBONES.get(backbone)
    assert isinstance(spec, ViTSpec)
    side = CROP // PATCH * 8
    torch.manual_seed(0)
    features = torch.randn(batch, spec.dpt_features, side, side).relu_()
    labels = torch.randint(0, NUM_CLASSES, (batch, CROP, CROP))
    cells = []
    for name in dict.fromkeys(["baseline", *ARGS.candidates]):
        torch.manual_seed(1)
        head = build_candidate(name, spec.dpt_features).train()
        reset_peak_memory(torch.device("cpu"))
        start_rss = rss_mib()
        counter = FlopCounterMode(display=False)
        with counter:
            head_pass(head, features, labels)  # also the warm-up
        peak = (peak_memory_mib(torch.device("cpu")) or float("nan")) - start_rss
        times = []
        for _ in range(repeats):
            head.zero_grad(set_to_none=True)
            tick = time.perf_counter()
            head_pass(head, features, labels)
            times.append(time.perf_counter() - tick)
        cell = {"backbone": backbone, "candidate": name, "batch": batch, "map": side, "step_s": statistics.median(times),
                "all_s": times, "gflop": counter.get_total_flops() / 1e9, "peak_above_start_mib": peak,
                "load": os.getloadavg()[0]}
        print(json.dumps(cell), flush=True)
        cells.append(cell)
    return with_ratios(cells, "baseline")


def with_ratios(cells: list[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    ref = next(c for c in cells if c["candidate"] == reference)
    for c in cells:
        for key, out in (("step_s", "time_ratio"), ("gflop", "flop_ratio"), ("peak_above_start_mib", "memory_ratio")):
            c[out] = c[key] / ref[key] if ref[key] else None
    return cells


def measure_inference(backbone: str) -> list[dict[str, Any]]:
    """T = 20 samples of one image from the ViT's maps: the NP candidates against decoder-scope MC dropout."""
    spec = BACKBONES.get(backbone)
    grid = CROP // PATCH
    torch.manual_seed(0)
    low, high = torch.randn(1, 3 * spec.embed_dim, grid, grid), torch.randn(1, spec.embed_dim, grid, grid)
    cells = []
    for name in ("mc_dropout", "np_today", "np_batched", "np_pool4", "np_shared_full"):
        torch.manual_seed(1)
        mc = name == "mc_dropout"
        decoder = DPTDecoder(spec.embed_dim, spec.dpt_features, spec.dpt_channels, mc_dropout=0.1 if mc else 0.0).eval()
        head = build_head("mc_dropout", spec.dpt_features, NUM_CLASSES) if mc else build_candidate(name, spec.dpt_features)
        if not mc:  # fill the memories once (inference reads the centers)
            with torch.no_grad():
                x = decoder(low, high)
                y = torch.randint(0, NUM_CLASSES, (1, CROP, CROP))
                head.train()(x, labels=y, context_features=x, context_labels=y, num_samples=1)
        head.eval()
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            tick = time.perf_counter()
            if mc:
                logits = torch.cat([head(decoder(low, high), num_samples=1).logits for _ in range(INFERENCE_SAMPLES)])
            else:
                logits = head(decoder(low, high), num_samples=INFERENCE_SAMPLES).logits
            F.interpolate(logits.flatten(0, 1), size=(CROP, CROP), mode="bilinear").softmax(1).mean(0)
            elapsed = time.perf_counter() - tick
        cell = {"backbone": backbone, "candidate": name, "samples": INFERENCE_SAMPLES, "s": elapsed,
                "gflop": counter.get_total_flops() / 1e9, "load": os.getloadavg()[0]}
        print(json.dumps(cell), flush=True)
        cells.append(cell)
    mc_cell = cells[0]
    for c in cells:
        c["time_over_mc_dropout"], c["flops_over_mc_dropout"] = c["s"] / mc_cell["s"], c["gflop"] / mc_cell["gflop"]
    return cells


def count_inference_flops(backbone: str) -> list[dict[str, Any]]:
    """FLOPs of T = 20 samples of one image from the ViT's maps, counted on the meta device (shapes only, nothing
    computed): MC dropout (decoder scope) = 20 x (DPT + classifier block); NP = the DPT once + the small ConvNet +
    the NP decoder with T = 20 (its inference path), at each ``feature_pool``. The attention on the centers, the
    memories and the final softmax are not convolutions or matrix products of this size and are left out."""
    spec = BACKBONES.get(backbone)
    grid, side = CROP // PATCH, CROP // PATCH * 8
    cells = []
    with torch.device("meta"):
        low, high = torch.randn(1, 3 * spec.embed_dim, grid, grid), torch.randn(1, spec.embed_dim, grid, grid)
        decoder = DPTDecoder(spec.embed_dim, spec.dpt_features, spec.dpt_channels).eval()
        mc_head = build_head("mc_dropout", spec.dpt_features, NUM_CLASSES).eval()
        np_head = build_head("np", spec.dpt_features, NUM_CLASSES).eval()
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            for _ in range(INFERENCE_SAMPLES):
                mc_head.classifier(decoder(low, high))
        cells.append({"candidate": "mc_dropout", "gflop": counter.get_total_flops() / 1e9})
        for pool in (1, 2, 4, 8):
            counter = FlopCounterMode(display=False)
            z, r = torch.randn(INFERENCE_SAMPLES, 1, np_head.latent_dim), torch.randn(1, np_head.latent_dim)
            with torch.no_grad(), counter:
                features = F.avg_pool2d(decoder(low, high), pool, ceil_mode=True) if pool > 1 else decoder(low, high)
                np_head.query_net(features)
                np_head.decoder.tail(np_head.decoder.first_conv(features, z, r))  # the inference path's convolutions
            cells.append({"candidate": f"np_pool{pool}" if pool > 1 else "np_today", "gflop": counter.get_total_flops() / 1e9})
    for c in cells:
        c.update(backbone=backbone, samples=INFERENCE_SAMPLES, map=side, flops_over_mc_dropout=c["gflop"] / cells[0]["gflop"])
        print(json.dumps(c), flush=True)
    return cells


def measure_steps(backbone: str, batch: int) -> list[dict[str, Any]]:
    """UniMatch V2's first training step through the project's loop (``gpu_acceptance.compose_cell``,
    ``setup_run``, ``train_step``; AdamW's state is allocated in it, as in every later step's peak), once per head,
    under the FLOP counter: its FLOPs, its peak RSS above the cell's start and its time (one step: a ratio, not a
    rate). Heads: the baseline, the NP default under ``corrected`` (``feature_pool="coarse"``: 4 on the DPT) and,
    with ``--step-today``, the NP head on the map as it is."""
    args = parse_arguments(["--device", "cpu", "--crop", str(CROP), "--backbone", backbone, "--steps-only"])
    device = torch.device("cpu")
    sizes = {"schedule.batch_size": batch, "schedule.unlabeled_batch_size": batch}
    cells, batches = [], None
    heads = [("baseline", "baseline", {}), ("np_pool4", "np", {})]
    heads += [("np_today", "np", {"head.options.feature_pool": 1})] if ARGS.step_today else []
    for name, head, more in heads:
        config = compose_cell(args, device, "unimatch_v2", head, **sizes, **more)
        with backend_flags(config, device):
            run = setup_run(config, device)
            batches = batches or list(itertools.islice(run.streams.epoch(0, 0), 1))
            reset_peak_memory(device)
            start_rss = rss_mib()
            counter = FlopCounterMode(display=False)
            tick = time.perf_counter()
            with counter:
                train_step(run.framework, batches[0], step_context(run, 0), run.optimizer, config, device,
                           run.world_size)
            elapsed = time.perf_counter() - tick
        peak = peak_memory_mib(device) or float("nan")
        cell = {"candidate": name, "backbone": backbone, "crop": CROP, "images": f"{batch} + {batch}",
                "feature_pool": config.head.options.get("feature_pool"), "step_s": elapsed,
                "gflop": counter.get_total_flops() / 1e9, "peak_rss_mib": peak, "peak_above_start_mib": peak - start_rss,
                "load": os.getloadavg()[0]}
        print(json.dumps(cell), flush=True)
        cells.append(cell)
        del run
    for c in cells:
        for key, out in (("step_s", "time_ratio"), ("gflop", "flop_ratio"), ("peak_rss_mib", "memory_ratio"),
                         ("peak_above_start_mib", "memory_above_start_ratio")):
            c[out] = c[key] / cells[0][key]
    return cells


def main(argv: list[str] | None = None) -> dict[str, Any]:
    global ARGS, CROP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["step", "head", "inference"],
                        choices=["head", "inference", "inference_flops", "step"])
    parser.add_argument("--backbones", nargs="+", default=["dinov2_s", "dinov2_b"])
    parser.add_argument("--batch", type=int, default=1, help="images per head pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--step-batch", type=int, default=1, help="labeled (= unlabeled) images of the step part")
    parser.add_argument("--step-today", action="store_true", help="also the step with the NP head on the full map")
    parser.add_argument("--crop", type=int, default=CROP, help="crop side (a multiple of 14; small: a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/np_dpt_candidates"))
    ARGS = parser.parse_args(argv)
    CROP = ARGS.crop
    torch.set_num_threads(max(1, torch.get_num_threads()))
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine(torch.device("cpu")),
        "command": shlex.join(["python", "benchmarks/np_dpt_candidates.py", *(argv if argv is not None else sys.argv[1:])]),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "load_at_start": os.getloadavg()}
    ARGS.out.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        report["load_at_end"] = os.getloadavg()
        (ARGS.out / "np_dpt_candidates.json").write_text(json.dumps(report, indent=1) + "\n")

    if "step" in ARGS.parts:
        report["step"] = measure_steps(ARGS.backbones[0], ARGS.step_batch)
        write()
    for backbone in ARGS.backbones:
        if "inference_flops" in ARGS.parts:
            report.setdefault("inference_flops", []).extend(count_inference_flops(backbone))
            write()
    for backbone in ARGS.backbones:
        if "head" in ARGS.parts:
            report.setdefault("head", []).extend(measure_heads(backbone, ARGS.batch, ARGS.repeats))
            write()
    for backbone in ARGS.backbones:
        if "inference" in ARGS.parts:
            report.setdefault("inference", []).extend(measure_inference(backbone))
            write()
    return report


ARGS: argparse.Namespace


if __name__ == "__main__":
    main()

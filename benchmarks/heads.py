"""Benchmark of the three classifier heads: train step and inference (results: ``docs/performance.md``).

Measures, side by side in one run (repetitions interleaved across heads, medians reported):

- train step: forward in ``train()`` with labels (NP: targets = the batch, context = its first
  half, memory update included), loss = mean over samples of the pixel CE at feature resolution
  + ``aux_loss``, backward (features are a leaf that requires grad, as the backbone's output);
- inference: forward in ``eval()`` under ``no_grad`` + ``predictive`` (mean softmax, entropy);
- peak memory of each: on CUDA ``max_memory_allocated`` above what was allocated before the
  step; on CPU the peak of the running sum of the CPU allocator's allocations and frees that
  ``torch.profiler`` (``profile_memory=True``) records during the step, measured in separate
  repetitions so the profiler does not perturb the timings.

Prints one JSON line per measurement, then one per target ratio. A timing ratio is the median over
repetitions of the ratio within a repetition (the two heads ran back to back), which is robust to
the load of a shared machine changing during the run; the ratio of the medians is printed too.
Times are wall clock (``*_s``) and process CPU time (``*_cpu_s``, all threads; on a shared CPU
it counts only this process's cycles); the timing targets are checked on both.
Usage::

    .venv/bin/python benchmarks/heads.py                 # CPU: B=4, C=512, 64x64, K=21, T=5, 2 threads
    .venv/bin/python benchmarks/heads.py --device cuda   # paper scale: B=12, 120x120, bf16 autocast
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile

from npsemiseg.heads import build_head, downsample_labels, predictive

HEAD_NAMES = ("baseline", "mc_dropout", "np")
# the heads' cost targets (docs/performance.md, Heads): (name, numerator, denominator, bound, "max" | "min")
TARGETS = (
    ("np_train_over_baseline_train", ("np", "train_s"), ("baseline", "train_s"), 2.8, "max"),
    ("np_infer_over_baseline_infer", ("np", "infer_s"), ("baseline", "infer_s"), 2.8, "max"),
    ("mc_dropout_infer_over_np_infer", ("mc_dropout", "infer_s"), ("np", "infer_s"), 1.8, "min"),
    ("np_train_peak_over_baseline_train_peak", ("np", "train_peak_bytes"), ("baseline", "train_peak_bytes"), 3.0, "max"),
)


def make_batch(batch: int, channels: int, size: int, classes: int, device: torch.device, stride: int = 4):
    """Features ``[B, C, s, s]`` (leaf, requires grad) and labels ``[B, 4s, 4s]`` with some ignore pixels.

    Labels are piecewise constant blocks (like segments), so every class appears in the batch.
    """
    g = torch.Generator().manual_seed(0)
    features = torch.randn(batch, channels, size, size, generator=g).to(device).requires_grad_(True)
    blocks = torch.randint(0, classes, (batch, 8, 8), generator=g)
    labels = F.interpolate(blocks[:, None].float(), size=(size * stride,) * 2, mode="nearest")[:, 0].long()
    labels[:, :stride, :] = 255
    return features, labels.to(device)


def train_step(head, features, labels, small_labels, autocast) -> None:
    head.train()
    head.zero_grad(set_to_none=True)
    features.grad = None
    m = features.shape[0] // 2
    with autocast():
        out = head(features, labels=labels, context_features=features[:m], context_labels=labels[:m])
        s = out.logits.shape[0]
        ce = F.cross_entropy(out.logits.flatten(0, 1).float(), small_labels.repeat(s, 1, 1), ignore_index=255)
        loss = ce + out.aux_loss
    loss.backward()


@torch.no_grad()
def inference(head, features, autocast) -> None:
    head.eval()
    with autocast():
        out = head(features)
    probs, entropy = predictive(out.logits)
    entropy.sum().item()


def seconds(fn: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``fn`` (CPU time: less sensitive to other users' load)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - start_cpu


def peak_bytes(fn: Callable[[], None], device: torch.device) -> int:
    """Peak of the bytes allocated during ``fn`` above what was allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int)
    parser.add_argument("--channels", type=int, default=512)
    parser.add_argument("--size", type=int, help="feature map side (default 64 on CPU, 120 on CUDA)")
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--samples", type=int, default=5, help="T for MC dropout and NP")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16 autocast (default: on for CUDA, off for CPU)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    batch = args.batch or (12 if device.type == "cuda" else 4)
    size = args.size or (120 if device.type == "cuda" else 64)
    bf16 = args.bf16 if args.bf16 is not None else device.type == "cuda"
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    def autocast():
        if bf16:
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    features, labels = make_batch(batch, args.channels, size, args.classes, device)
    small_labels = downsample_labels(labels, (size, size))
    options = {"baseline": {}, "mc_dropout": {"training_samples": args.samples}, "np": {"training_samples": args.samples}}
    heads = {name: build_head(name, args.channels, args.classes, **options[name]).to(device) for name in HEAD_NAMES}
    config = {"device": str(device), "batch": batch, "channels": args.channels, "size": size,
              "classes": args.classes, "samples": args.samples, "threads": args.threads, "bf16": bf16,
              "torch": torch.__version__}

    def step(name: str) -> Callable[[], None]:
        return lambda: train_step(heads[name], features, labels, small_labels, autocast)

    def infer(name: str) -> Callable[[], None]:
        return lambda: inference(heads[name], features, autocast)

    for name in HEAD_NAMES:  # warm-up; also fills the NP memories before its inference
        step(name)()
        infer(name)()
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for phase, fn in (("train", step), ("infer", infer)):
            for name in HEAD_NAMES:
                wall, cpu = seconds(fn(name), device)
                times.setdefault((name, f"{phase}_s"), []).append(wall)
                times.setdefault((name, f"{phase}_cpu_s"), []).append(cpu)
    results: dict[tuple[str, str], float] = {key: statistics.median(v) for key, v in times.items()}
    for name in HEAD_NAMES:
        results[(name, "train_peak_bytes")] = peak_bytes(step(name), device)
        results[(name, "infer_peak_bytes")] = peak_bytes(infer(name), device)

    for (name, metric), value in sorted(results.items()):
        record = {"head": name, "metric": metric, "value": value, **config}
        if (name, metric) in times:
            record["runs"] = times[(name, metric)]
        print(json.dumps(record))
    timing_targets = [(f"{t}_cpu_time", (n[0], n[1].replace("_s", "_cpu_s")), (d[0], d[1].replace("_s", "_cpu_s")), b, k)
                      for t, n, d, b, k in TARGETS if n[1].endswith("_s")]
    for target, num, den, bound, kind in TARGETS + tuple(timing_targets):
        record = {"target": target, "bound": bound, "kind": kind}
        if num in times:  # timings: ratio within each repetition (side by side), then the median
            paired = [a / b for a, b in zip(times[num], times[den])]
            record["paired_ratios"] = [round(r, 3) for r in paired]
            record["ratio_of_medians"] = round(results[num] / results[den], 3)
            ratio = statistics.median(paired)
        else:
            ratio = results[num] / results[den]
        ok = ratio <= bound if kind == "max" else ratio >= bound
        print(json.dumps({**record, "ratio": round(ratio, 3), "met": ok, **config}))


if __name__ == "__main__":
    main()

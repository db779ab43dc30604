"""Does the data pipeline keep up with the step? Images/s of a cell's training data streams against the step's.

For each framework, the cell's configuration as ``gpu_acceptance.py`` composes it (preset ``paper``: crop 480, 3
labeled + 3 unlabeled images per GPU, the framework's weak and strong augmentations of each stream, e.g. the two
strong views of UniMatch and FixMatch's colour / blur / CutMix source draws, AugSeg's; ``data.num_workers`` as the
preset sets it, or ``--workers``) on the synthetic VOC stand-in at VOC's image size (375 x 500), and the run's own
data streams (``npsemiseg.training.data_order.Streams``, built as ``npsemiseg.training.setup.setup_run`` builds
them, without the network: the head and backbone change no data setting). Two passes per framework:

- **one process** (``data.num_workers`` 0, one torch thread, as in a worker): one untimed batch, then ``--batches``
  batches; the pipeline's CPU seconds per image (``cpu_s_per_image``, process time: steady on a shared machine).
  ``ideal images/s`` = workers / ``cpu_s_per_image``: what the configured workers give with a free core each.
- **workers** (the configured ``data.num_workers`` W): W untimed batches (the workers start together, so the W-th
  batch comes when the first round is done), then ``--rounds`` x W timed batches: loader images/s = (labeled +
  unlabeled images per batch) x batches / seconds, measured on this machine (its cores shared with whatever runs).

The synthetic stand-in draws each image procedurally (about 0.3 CPU s for a 375 x 500 image, against a few ms to
decode a VOC JPEG), so each framework is measured twice: ``synthetic`` (the items drawn as the stand-in draws them)
and ``cached`` (``--raw-items`` raw items drawn once before timing and served from memory, :class:`Cached`: what
is left is the pipeline itself, the weak and strong transforms, collation and the workers' transport, the figure
to set against a real dataset's step).

What the step consumes: images per step / step time, the step time per framework from ``--step-ms FRAMEWORK=MS``
(repeatable) or the ``cells`` of a ``gpu_acceptance.json`` (``--steps-from``; a framework's fastest head, the most
demanding for its loader). Headroom = loader images/s / step images/s, measured and ideal: above 1 the loader
keeps up (the ideal one on a machine with a free core per worker besides the step's own host thread). One
process per GPU draws its own batches: compare with one GPU's step.

    python benchmarks/loader_throughput.py --batches 2 --step-ms unimatch=141 fixmatch=113
    python benchmarks/loader_throughput.py --steps-from benchmarks/results/gpu_acceptance/gpu_acceptance.json
    python benchmarks/loader_throughput.py --frameworks unimatch --workers 2 4 8 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from npsemiseg.config import RunConfig, cell_config
from npsemiseg.frameworks import framework_names, get_framework
from npsemiseg.training.data_order import Streams
from npsemiseg.training.factories import build_datasets, train_transforms
from npsemiseg.training.plan import plan_run

from gpu_acceptance import DATASET, PARTITION, VOC_IMAGE, machine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "loader_throughput"
PRINTED = ("framework", "raw", "workers", "cpu_s_per_image", "loader_images_per_s", "ideal_images_per_s",
           "step_images_per_s", "headroom", "error")


def loader_config(framework: str, workers: int | None) -> RunConfig:
    """The framework's paper-scale cell on the synthetic VOC stand-in at VOC's image size, on the CPU (its
    supervised-only / warm-up phases left as they are: they change no data setting, and the run's streams draw the
    labeled and unlabeled batches either way)."""
    overrides: dict[str, Any] = {"runtime.device": "cpu", "runtime.progress": "off", "runtime.output_dir": None,
                                 "model.weights": None,
                                 "data.options": {"image_size": list(VOC_IMAGE), "train_size": 64, "val_size": 2}}
    if workers is not None:
        overrides["data.num_workers"] = workers
    return cell_config("paper", framework=framework, dataset=DATASET, partition=PARTITION, head="baseline", **overrides)


class Cached(Dataset):
    """``dataset``'s first ``count`` raw items, drawn once; item ``i`` is a copy of raw item ``i mod count``."""

    def __init__(self, dataset: Dataset, count: int) -> None:
        self.length = len(dataset)
        self.items = [dataset[i] for i in range(min(count, self.length))]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.items[i % len(self.items)]
        return {k: v.clone() if isinstance(v, Tensor) else v for k, v in item.items()}


def datasets_of(config: RunConfig, raw_items: int | None) -> dict[str, Dataset]:
    """The run's datasets, the training splits :class:`Cached` when ``raw_items``."""
    datasets = build_datasets(config)
    if raw_items:
        datasets = {k: Cached(v, raw_items) if k in ("labeled", "unlabeled") else v for k, v in datasets.items()}
    return datasets


def streams_of(config: RunConfig, datasets: dict[str, Dataset]) -> tuple[Streams, int]:
    """The run's data streams (``setup_run``'s, rank 0 of 1, unpinned) and the images each batch carries."""
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]), world_size=1)
    uses_unlabeled = get_framework(config.framework).uses_unlabeled
    streams = Streams(config, datasets, train_transforms(config), plan, use_unlabeled=uses_unlabeled, rank=0,
                      world_size=1, pin_memory=False)
    images = config.schedule.batch_size + (config.schedule.unlabeled_batch_size if uses_unlabeled else 0)
    return streams, images


def timed_batches(streams: Streams, warmup: int, batches: int) -> dict[str, Any]:
    """``warmup`` untimed batches, then ``batches`` timed ones: seconds, process CPU seconds, the first batch."""
    tick = time.perf_counter()
    stream = iter(streams.epoch(0, 0))
    drawn = list(itertools.islice(stream, warmup))
    first = time.perf_counter() - tick
    tick, cpu = time.perf_counter(), time.process_time()
    drawn = list(itertools.islice(stream, batches))
    seconds, cpu_seconds = time.perf_counter() - tick, time.process_time() - cpu
    if len(drawn) < batches:
        raise RuntimeError(f"the streams gave {len(drawn)} batches after the warm-up, {batches} asked")
    views = sorted(drawn[0].labeled) + sorted(f"u/{k}" for k in (drawn[0].unlabeled or {}))
    return {"warmup_s": first, "seconds": seconds, "cpu_seconds": cpu_seconds, "views": views}


def measure_loader(framework: str, workers: int | None, batches: int, rounds: int,
                   raw_items: int | None = None) -> dict[str, Any]:
    """The one-process and the workers pass (module docstring) of ``framework``'s streams."""
    config = loader_config(framework, workers)
    datasets = datasets_of(config, raw_items)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        streams, images = streams_of(loader_config(framework, 0), datasets)
        alone = timed_batches(streams, 1, batches)
    finally:
        torch.set_num_threads(threads)
    count = config.data.num_workers
    streams, _ = streams_of(config, datasets)
    pooled = timed_batches(streams, max(count, 1), rounds * max(count, 1)) if count else alone
    cpu_per_image = alone["cpu_seconds"] / (images * batches)
    return {"framework": framework, "raw": "cached" if raw_items else "synthetic", "workers": count,
            "images_per_batch": images, "crop": config.schedule.crop_size,
            "strong": config.data.augmentation.get("strong"), "views": alone["views"], "cpu_s_per_image": cpu_per_image,
            "one_process_images_per_s": images * batches / alone["seconds"],
            "ideal_images_per_s": max(count, 1) / cpu_per_image, "first_round_s": pooled["warmup_s"],
            "loader_images_per_s": images * rounds * max(count, 1) / pooled["seconds"]}


def step_seconds(args: argparse.Namespace) -> dict[str, float]:
    """Step time per framework: ``--steps-from`` (a framework's fastest cell) updated by ``--step-ms``."""
    out: dict[str, float] = {}
    if args.steps_from:
        for cell in json.loads(Path(args.steps_from).read_text()).get("cells", []):
            if "step_s" in cell:
                out[cell["framework"]] = min(out.get(cell["framework"], float("inf")), float(cell["step_s"]))
    for item in args.step_ms:
        framework, _, ms = item.partition("=")
        if framework not in framework_names() or not ms:
            raise SystemExit(f"--step-ms {item!r}: expected FRAMEWORK=MS with FRAMEWORK one of {sorted(framework_names())}")
        out[framework] = float(ms) / 1000
    return out


def with_step(row: dict[str, Any], steps: dict[str, float]) -> dict[str, Any]:
    """The row with what the step consumes and the headrooms, when the framework's step time is known."""
    step_s = steps.get(row["framework"])
    if step_s is None:
        return {**row, "step_s": None, "step_images_per_s": None, "headroom": None, "ideal_headroom": None}
    consumed = row["images_per_batch"] / step_s
    return {**row, "step_s": step_s, "step_images_per_s": consumed, "headroom": row["loader_images_per_s"] / consumed,
            "ideal_headroom": row["ideal_images_per_s"] / consumed}


def markdown(report: dict[str, Any]) -> str:
    lines = ["# Loader throughput against the step", "", f"- date: {report['date']}", f"- machine: {report['machine']}",
             f"- command: `{report['command']}`", "",
             "| framework | raw items | workers | images / batch | CPU s / image | loader images/s | ideal images/s | "
             "step ms | step images/s | headroom | ideal headroom |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["results"]:
        if "error" in row:
            lines.append(f"| {row['framework']} | error: {row['error']} |" + " |" * 9)
            continue
        step = (f"{1000 * row['step_s']:.0f} | {row['step_images_per_s']:.1f} | **{row['headroom']:.2f}** | "
                f"{row['ideal_headroom']:.2f}" if row["step_s"] else "- | - | - | -")
        lines.append(f"| {row['framework']} | {row['raw']} | {row['workers']} | {row['images_per_batch']} | "
                     f"{row['cpu_s_per_image']:.3f} | {row['loader_images_per_s']:.1f} | {row['ideal_images_per_s']:.1f} | "
                     f"{step} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", nargs="+", default=list(framework_names()), choices=list(framework_names()))
    parser.add_argument("--workers", nargs="+", type=int, default=None,
                        help="data.num_workers to measure (default: the preset's)")
    parser.add_argument("--batches", type=int, default=3, help="timed batches of the one-process pass")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (one batch per worker) of the workers pass")
    parser.add_argument("--raw-items", type=int, default=4, help="raw items held in memory for the cached pass")
    parser.add_argument("--raw", nargs="+", default=["synthetic", "cached"], choices=["synthetic", "cached"])
    parser.add_argument("--step-ms", nargs="*", default=[], metavar="FRAMEWORK=MS", help="one GPU's step time")
    parser.add_argument("--steps-from", type=Path, default=None, help="a gpu_acceptance.json whose cells give step_s")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    steps = step_seconds(args)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(torch.device("cpu")) + f", load average {os.getloadavg()[0]:.1f}",
        "command": shlex.join(["python", "benchmarks/loader_throughput.py", *(argv if argv is not None else sys.argv[1:])]),
        "results": []}
    for framework, workers, raw in itertools.product(args.frameworks, args.workers or [None], args.raw):
        try:
            cached = args.raw_items if raw == "cached" else None
            row = with_step(measure_loader(framework, workers, args.batches, args.rounds, cached), steps)
        except Exception as error:  # noqa: BLE001 - one framework's failure is recorded, the others go on
            row = {"framework": framework, "error": f"{type(error).__name__}: {error}".splitlines()[0][:300]}
        report["results"].append(row)
        print(json.dumps({k: row[k] for k in PRINTED if k in row}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loader_throughput.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "loader_throughput.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()

"""Peak memory and time of one training step with and without ``runtime.activation_checkpointing`` (each ResNet stage
or ViT block of the encoder recomputed in the backward pass).

Each framework x setting runs in a process of its own (a fresh allocator), seeded, with in-process data loading:
the GPU acceptance run's cell (``gpu_acceptance.compose_cell``: paper preset, random init, the chosen backbone and
crop), two steps, then a third measured. On CPU the figure is the peak of the tensors the step allocates
(``step_memory.step_peak_mib``: torch.profiler's memory timeline), on CUDA ``max_memory_allocated`` during the
step (parameters, optimiser state and data included); the step's wall and process-CPU time are the third step's
(on CPU measured apart from the profiled fourth step).

    python benchmarks/activation_checkpointing.py --crop 240 --frameworks supervised unimatch
    python benchmarks/activation_checkpointing.py --device cuda --crop 513 --frameworks supervised unimatch u2pl
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy
import torch

from npsemiseg.training.setup import setup_run
from npsemiseg.training.step import train_step

import gpu_acceptance
import step_memory

HERE = Path(__file__).resolve()


def measure(args: argparse.Namespace, framework: str, checkpointed: bool) -> dict[str, float]:
    """The third step's peak MiB and seconds of one cell in this process."""
    random.seed(0)
    numpy.random.seed(0)
    torch.manual_seed(0)
    device = torch.device(args.device)
    config = gpu_acceptance.compose_cell(args, device, framework, args.head, **{
        "data.num_workers": 0, "runtime.activation_checkpointing": checkpointed})
    run = setup_run(config, device)
    batches = list(itertools.islice(run.streams.epoch(0, 0), 4))

    def step(index: int) -> None:
        train_step(run.framework, batches[index], gpu_acceptance.step_context(run, index), run.optimizer, config,
                   device, run.world_size)
        gpu_acceptance.synchronize(device)

    step(0)
    step(1)
    cell = {"batch_size": config.schedule.batch_size, "unlabeled_batch_size": config.schedule.unlabeled_batch_size,
            "crop": config.schedule.crop_size, "backbone": config.model.backbone}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started, cpu = time.perf_counter(), time.process_time()
    step(2)
    cell.update(seconds=time.perf_counter() - started, cpu_seconds=time.process_time() - cpu)
    if device.type == "cuda":
        return {**cell, "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20}
    return {**cell, "peak_mib": step_memory.step_peak_mib(lambda: step(3))}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--crop", type=int, default=240)
    parser.add_argument("--backbone", default="resnet101")
    parser.add_argument("--head", default="baseline")
    parser.add_argument("--frameworks", nargs="+", default=["supervised", "unimatch"])
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--cell", nargs=2, metavar=("FRAMEWORK", "ON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.tiny, args.steps = False, 1  # what gpu_acceptance.compose_cell reads
    if args.cell:
        print(json.dumps(measure(args, args.cell[0], args.cell[1] == "on")), flush=True)
        return {}
    options = ["--device", args.device, "--crop", str(args.crop), "--backbone", args.backbone, "--head", args.head]
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": gpu_acceptance.machine(torch.device(args.device)), "torch": torch.__version__,
        "load": os.getloadavg()[0],
        "command": shlex.join(["python", "benchmarks/activation_checkpointing.py",
                               *(argv if argv is not None else sys.argv[1:])]),
        "cells": [],
    }
    for framework in args.frameworks:
        row = {}
        for setting in ("off", "on"):
            done = subprocess.run([sys.executable, str(HERE), *options, "--cell", framework, setting],
                                  capture_output=True, text=True, check=True)
            row[setting] = json.loads(done.stdout.strip().splitlines()[-1])
            report["cells"].append({"framework": framework, "checkpointing": setting, **row[setting]})
        off, on = row["off"], row["on"]
        print(f"{framework:<11} peak {off['peak_mib']:9.1f} -> {on['peak_mib']:9.1f} MiB "
              f"({on['peak_mib'] / off['peak_mib']:.3f}x)  step {off['seconds']:7.3f} -> {on['seconds']:7.3f} s "
              f"({on['seconds'] / off['seconds']:.2f}x), CPU {off['cpu_seconds']:7.3f} -> {on['cpu_seconds']:7.3f} s "
              f"({on['cpu_seconds'] / off['cpu_seconds']:.2f}x)", flush=True)
    report["load_after"] = os.getloadavg()[0]
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()

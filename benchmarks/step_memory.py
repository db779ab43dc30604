"""Peak memory of the tensors one training step allocates, counted on CPU: a stand-in for the GPU's peak when no GPU
is lent (``docs/history/performance.md``, "Peak memory of a step, counted on CPU").

Each framework x head runs in a process of its own (a fresh allocator, nothing freed late by an earlier cell), seeded
(torch, numpy, random) with in-process data loading, so a cell gives the same figure run after run. The cell is the
GPU acceptance run's (``gpu_acceptance.compose_cell``: paper preset, ResNet-101 at random init, 3 + 3 images of
``--crop``), two steps, then a third step under ``torch.profiler`` with ``profile_memory``: its memory timeline gives
the bytes of tensors created and destroyed during the step, and the peak of their running sum is the figure, the part
of a GPU's ``max_memory_allocated`` that the step itself adds (parameters, optimiser state and the data already
there are not in it; neither are cuDNN's workspaces). Python's garbage collector is off during the step, so a
tensor held by a reference cycle is freed at the same point in every run. ``--bf16`` runs the step under CPU bf16
autocast, as the GPU run's bf16 autocast; ``--np-samples-per-conv 5`` takes the NP decoder's CUDA path.

    python benchmarks/step_memory.py --crop 240 --bf16 --np-samples-per-conv 5 --frameworks unimatch psmt
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import itertools
import json
import random
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy
import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action, MemoryProfile

from npsemiseg.frameworks import framework_names
from npsemiseg.training.setup import setup_run
from npsemiseg.training.step import train_step

import gpu_acceptance

HERE = Path(__file__).resolve()


def step_peak_mib(step: Any) -> float:
    """Peak MiB of the tensors ``step()`` allocates (the running sum of creations minus destructions)."""
    gc.collect()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            step()
    finally:
        gc.enable()
    live = peak = 0
    for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak / 2**20


def measure_cell(args: argparse.Namespace, framework: str, head: str) -> float:
    random.seed(0)
    numpy.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device("cpu")
    config = gpu_acceptance.compose_cell(args, device, framework, head, **{"data.num_workers": 0})
    run = setup_run(config, device)
    gpu_acceptance.configure_np_decoders(run, args)
    batches = list(itertools.islice(run.streams.epoch(0, 0), 3))

    def step(index: int) -> None:
        train_step(run.framework, batches[index], gpu_acceptance.step_context(run, index), run.optimizer, config,
                   device, run.world_size)

    step(0)
    step(1)
    with torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext():
        return step_peak_mib(lambda: step(2))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crop", type=int, default=240)
    parser.add_argument("--backbone", default="resnet101")
    parser.add_argument("--bf16", action="store_true", help="the step under CPU bf16 autocast (as the GPU run's)")
    parser.add_argument("--np-samples-per-conv", type=int, default=None, metavar="N")
    parser.add_argument("--np-keep-first-stage", action="store_true", help="as gpu_acceptance.py's")
    parser.add_argument("--frameworks", nargs="+", default=list(framework_names()))
    parser.add_argument("--heads", nargs="+", default=["baseline", "np"])
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--cell", nargs=2, metavar=("FRAMEWORK", "HEAD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.tiny, args.steps = False, 1  # what gpu_acceptance.compose_cell reads
    if args.cell:
        print(json.dumps({"peak_mib": measure_cell(args, *args.cell)}), flush=True)
        return {}
    options = ["--crop", str(args.crop), "--backbone", args.backbone, *(["--bf16"] if args.bf16 else []),
               *(["--np-samples-per-conv", str(args.np_samples_per_conv)] if args.np_samples_per_conv else []),
               *(["--np-keep-first-stage"] if args.np_keep_first_stage else [])]
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": gpu_acceptance.machine(torch.device("cpu")), "torch": torch.__version__,
        "command": shlex.join(["python", "benchmarks/step_memory.py", *(argv if argv is not None else sys.argv[1:])]),
        "cells": [],
    }
    for framework in args.frameworks:
        row = {}
        for head in args.heads:
            done = subprocess.run([sys.executable, str(HERE), *options, "--cell", framework, head],
                                  capture_output=True, text=True, check=True)
            row[head] = json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]
            report["cells"].append({"framework": framework, "head": head, "peak_mib": row[head]})
        ratios = "  ".join(f"{h}/baseline {row[h] / row['baseline']:.3f}" for h in row if h != "baseline" and "baseline" in row)
        print(f"{framework:<11}" + "  ".join(f"{h} {v:8.1f} MiB" for h, v in row.items()) + f"  {ratios}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()

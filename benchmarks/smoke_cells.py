"""Cost of one ``smoke`` cell per framework x head: config resolution and ``train()``, in-process.

The grid of smoke cells (every framework x head x partition on the synthetic stand-ins) must
fit in a few minutes on two cores, so this prints, per cell, one JSON line: ``config_s``
(``npsemiseg.config.compose``), ``train_s`` (``train()`` wall time: datasets, model, steps, final
evaluation), ``steps_s`` (training steps only) and ``setup_eval_s`` (the rest: datasets, models, evaluation). The first cell also
pays the imports (torch, torchvision, matplotlib); it is run twice and only the second run is
kept. A last line sums the means over the cells and projects a grid of ``--grid-cells`` cells
(same mix of frameworks and heads) on one core.

    .venv/bin/python benchmarks/smoke_cells.py [--repeats 2] [--threads 1] [--grid-cells 156]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--grid-cells", type=int, default=156)
    parser.add_argument("--dataset", default="synthetic")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from npsemiseg.config import cell_config
    from npsemiseg.frameworks import framework_names
    from npsemiseg.training import train

    warm = cell_config("smoke", framework="supervised", dataset=args.dataset, head="np")
    train(warm)  # imports and one-time initialisation
    totals = []
    for framework in framework_names():
        for head in ("baseline", "mc_dropout", "np"):
            config_s, train_s, steps_s = [], [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                config = cell_config("smoke", framework=framework, dataset=args.dataset, head=head)
                config_s.append(time.perf_counter() - start)
                result = train(config)
                train_s.append(result.seconds)
                steps_s.append(result.train_seconds)
            row = {
                "bench": "smoke_cell", "framework": framework, "head": head, "steps": result.steps,
                "config_s": round(statistics.mean(config_s), 4), "train_s": round(statistics.mean(train_s), 3),
                "steps_s": round(statistics.mean(steps_s), 3),
                "setup_eval_s": round(statistics.mean(train_s) - statistics.mean(steps_s), 3),
                "miou": round(result.metrics["miou"], 4), "threads": args.threads,
            }
            totals.append(row["config_s"] + row["train_s"])
            print(json.dumps(row), flush=True)
    mean_cell = statistics.mean(totals)
    print(json.dumps({
        "bench": "smoke_grid_projection", "cells_measured": len(totals), "mean_cell_s": round(mean_cell, 3),
        "grid_cells": args.grid_cells, "grid_one_core_s": round(mean_cell * args.grid_cells, 1),
        "machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "torch": torch.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()

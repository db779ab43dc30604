"""Orchestration overhead of one smoke cell: ``run_cell`` wall time minus the training loop's own.

For ``workers`` in 0 (Ray Train's local mode), 1 and 2 (DDP over gloo), runs the ``smoke``
cell through :func:`semiseg_platform.launch.run_cell` and prints one JSON line per run:
``wall_s`` (run_cell), ``loop_s`` (``train()``'s own wall time, last attempt), ``overhead_s``
(their difference: MLflow run open/close and logging, Ray Train controller and worker start,
process-group setup, checkpoint persistence), ``train_s`` (training steps only) and the
machine's 1-minute load average before and after. The MLflow store is created and Ray is
started before timing (``ray_init_s`` is printed separately), so each figure is the per-cell
cost on a warm driver.

    .venv/bin/python benchmarks/cell_overhead.py [--workers 0 1 2] [--repeats 1] [--cpus-per-worker 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cpus-per-worker", type=float, default=0.5)
    parser.add_argument("--head", default="np")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from npsemiseg.config import cell_config
    from semiseg_platform.launch import ensure_ray, run_cell
    from semiseg_platform.tracking import prepare_experiment, resolve_tracking_uri

    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16",
                                   head=args.head, **{"runtime.device": "cpu"})
    with tempfile.TemporaryDirectory(prefix="cell-overhead-") as tmp:
        root = Path(tmp)
        tracking = resolve_tracking_uri(str(root / "mlruns.db"))
        prepare_experiment(tracking, "cell_overhead")
        if any(w > 0 for w in args.workers):
            started = time.perf_counter()
            ensure_ray(num_cpus=os.cpu_count())
            print(json.dumps({"benchmark": "cell_overhead", "ray_init_s": round(time.perf_counter() - started, 2)}),
                  flush=True)
        for repeat in range(args.repeats):
            for workers in args.workers:
                load_before = os.getloadavg()[0]
                result = run_cell(config, workers=workers, cpus_per_worker=args.cpus_per_worker,
                                  storage=root / f"storage-{workers}-{repeat}", tracking=tracking,
                                  experiment="cell_overhead", name=f"w{workers}-r{repeat}")
                print(json.dumps({
                    "benchmark": "cell_overhead", "workers": workers, "repeat": repeat, "steps": result.steps,
                    "wall_s": round(result.wall_seconds, 2), "loop_s": round(result.loop_seconds, 2),
                    "overhead_s": round(result.overhead_seconds, 2), "train_s": round(result.train_seconds, 2),
                    "load_1m_before": round(load_before, 2), "load_1m_after": round(os.getloadavg()[0], 2),
                    "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                }), flush=True)


if __name__ == "__main__":
    main()

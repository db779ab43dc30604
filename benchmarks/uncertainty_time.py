"""The paper's uncertainty-time figure (Section 4.2): seconds to predict with uncertainty vs T.

Full U2PL DeepLabv3+ with a ResNet-50 (output stride 8, random weights) and three heads:

- ``baseline``: the plain classifier, one prediction (T = 1), for reference;
- ``mc_dropout``: MC dropout the paper's way (``mc_dropout_scope="decoder"``): the encoder runs
  once, the whole decoder (ASPP, fusion, classifier) T times with dropout after every activation;
- ``np``: NP-SemiSeg's head with default options, its memories filled by one training-mode step
  on random images (only the stored centers are used at inference).

Evaluation modes (``npsemiseg.evaluation.predict``):

- ``center_crop``: one image of ``--crop`` x ``--crop`` (default 321 on CPU), crop ``--crop``;
- ``sliding``: U2PL's scheme (shifted windows, stride ceil(2/3 window), logits averaged) on a
  small image (default 129 x 257, window 129, stride 86: 3 windows) so it fits a CPU budget;
- ``sliding_global``: the same windows with one NP latent per image (NP only): what the fix for
  the paper's Limitations section costs.

Every case is one ``predict`` call (probabilities + entropy of one image), timed side by side:
warm-up (``--warmup`` untimed T=1 calls of each model), then ``--repeats`` rounds, each running
every case once in a rotated order; medians are reported (per-round times go to stderr).
Prints one JSON line per case (``uncertainty_seconds`` = median wall seconds per image, the field
name of the tracking schema; ``cpu_median`` = median process-CPU seconds, the steadier figure on a
shared CPU) and one per target and measure, and writes the plot
(``benchmarks/figures/uncertainty_time.png``, wall seconds).

Targets (CPU, 321 x 321 center crop): NP at T=5 <= 1.35 x baseline; MC dropout at T=5 >= 2 x NP
at T=5; MC dropout at T=20 >= 3 x NP at T=20. Usage::

    .venv/bin/python benchmarks/uncertainty_time.py                  # CPU, 2 threads (~25 core-minutes)
    .venv/bin/python benchmarks/uncertainty_time.py --modes center_crop --ts 1 5 --repeats 1   # quick look
    .venv/bin/python benchmarks/uncertainty_time.py --tracking-uri sqlite:///mlruns.db   # + MLflow runs; then
    .venv/bin/npsemiseg tables --tracking sqlite:///mlruns.db --experiment npsemiseg-benchmarks   # the figure
    .venv/bin/python benchmarks/uncertainty_time.py --device cuda --crop 513 --sliding-size 1024 2048 \\
        --window 769                                                   # paper scale on a GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch

from npsemiseg.evaluation import SlidingScheme, predict, sliding_windows, time_interleaved
from npsemiseg.models import build_segmentor

HEADS = ("baseline", "mc_dropout", "np")
MODES = ("center_crop", "sliding", "sliding_global")
FIGURE = Path(__file__).parent / "figures" / "uncertainty_time.png"
# (name, numerator case, denominator case, bound, "max" | "min") at the center crop
TARGETS = (
    ("np_T5_over_baseline", ("np", 5), ("baseline", 1), 1.35, "max"),
    ("mc_dropout_T5_over_np_T5", ("mc_dropout", 5), ("np", 5), 2.0, "min"),
    ("mc_dropout_T20_over_np_T20", ("mc_dropout", 20), ("np", 20), 3.0, "min"),
)


def build_models(num_classes: int, backbone: str, device: torch.device) -> dict[str, torch.nn.Module]:
    """The three segmentors with the same (seeded) random encoder/decoder weights, in eval mode."""
    models = {}
    for head in HEADS:
        torch.manual_seed(0)
        model = build_segmentor(num_classes=num_classes, head=head, variant="u2pl", backbone=backbone,
                                mc_dropout_scope="decoder").to(device)
        if head == "np":
            fill_np_memories(model, num_classes, device)
        models[head] = model.eval()
    return models


@torch.no_grad()
def fill_np_memories(model: torch.nn.Module, num_classes: int, device: torch.device) -> None:
    """One training-mode forward with labels (every class present) and context, as training would."""
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(2, 3, 129, 129, generator=generator)
    labels = torch.arange(num_classes).repeat_interleave(math.ceil(129 * 129 / num_classes))[: 129 * 129]
    labels = labels.view(1, 129, 129).repeat(2, 1, 1)
    model.train()
    model(images.to(device), labels=labels.to(device), num_context=1)
    model.eval()


def cases_for(mode: str, ts: list[int]) -> list[tuple[str, int]]:
    """(head, T) pairs timed in ``mode``: the baseline once (T=1), the stochastic heads at every T."""
    if mode == "sliding_global":
        return [("np", t) for t in ts]
    return [("baseline", 1)] + [(head, t) for head in ("mc_dropout", "np") for t in ts]


def machine() -> dict:
    info = {"machine": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    if hasattr(os, "getloadavg"):
        info["loadavg"] = [round(v, 2) for v in os.getloadavg()]
    return info


def plot(records: list[dict], path: Path) -> None:
    """One column per evaluation (center crop; sliding with the sliding_global NP line added), wall
    seconds on the top row and process-CPU seconds below."""
    from matplotlib.figure import Figure

    panels = [m for m in ("center_crop", "sliding") if any(r["eval_mode"].startswith(m) for r in records)]
    figure = Figure(figsize=(4.6 * len(panels), 7.0))
    axes = figure.subplots(2, len(panels), squeeze=False)
    lines = {  # (eval_mode, head) -> label, colour, marker, linestyle
        ("mc_dropout", False): ("MC dropout (decoder)", "tab:red", "o", "-"),
        ("np", False): ("NP-SemiSeg", "tab:blue", "s", "-"),
        ("np", True): ("NP-SemiSeg, one global latent", "tab:blue", "^", "--"),
    }
    for column, panel in enumerate(panels):
        rows = [r for r in records if r["eval_mode"] in (panel, panel + "_global")]
        for row, (measure, unit) in enumerate((("uncertainty_seconds", "wall s"), ("cpu_median", "process-CPU s"))):
            ax = axes[row][column]
            for (head, global_), (label, colour, marker, style) in lines.items():
                points = sorted((r["num_samples"], r[measure]) for r in rows
                                if r["head"] == head and r["eval_mode"].endswith("_global") == global_)
                if points:
                    ax.plot(*zip(*points), marker=marker, color=colour, linestyle=style, label=label)
            for r in rows:
                if r["head"] == "baseline":
                    ax.axhline(r[measure], color="grey", linestyle=":", label="baseline (T=1)")
            ax.set_xticks(sorted({r["num_samples"] for r in rows}))
            size = "x".join(str(s) for s in rows[0]["image_size"])
            ax.set(title=f"{panel} ({size})", xlabel="number of predictions T", ylabel=f"{unit} per image")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--ts", type=int, nargs="+", default=[1, 5, 10, 20], help="numbers of predictions T")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--crop", type=int, default=321, help="center-crop image and crop size")
    parser.add_argument("--crop-classes", type=int, default=21, help="K for center crop (VOC)")
    parser.add_argument("--sliding-size", type=int, nargs=2, default=[129, 257], metavar=("H", "W"))
    parser.add_argument("--window", type=int, default=129, help="sliding window (stride ceil(2/3 window))")
    parser.add_argument("--sliding-classes", type=int, default=19, help="K for sliding (Cityscapes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed T=1 calls per model and mode")
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument("--replot", type=Path, metavar="JSONL", help="only redraw the figure from a run's output")
    parser.add_argument("--tracking-uri", help="also record each (mode, head) series as an MLflow benchmark run "
                        "there, where `npsemiseg tables` builds the paper's figure from them")
    parser.add_argument("--experiment", default="npsemiseg-benchmarks", help="MLflow experiment of those runs")
    args = parser.parse_args(argv)
    if args.replot is not None:
        lines = [json.loads(line) for line in args.replot.read_text().splitlines() if line.startswith("{")]
        plot([r for r in lines if "eval_mode" in r], args.figure)
        return 0

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    print(json.dumps({"benchmark": "uncertainty_time", "event": "start", "date": stamp, **machine(),
                      "argv": sys.argv[1:]}), flush=True)
    records: list[dict] = []
    stride = math.ceil(args.window * 2 / 3)
    for num_classes, modes in ((args.crop_classes, [m for m in args.modes if m == "center_crop"]),
                               (args.sliding_classes, [m for m in args.modes if m != "center_crop"])):
        if not modes:
            continue
        models = build_models(num_classes, args.backbone, device)
        cases, settings = {}, {}
        for mode in modes:
            if mode == "center_crop":
                size, options = (args.crop, args.crop), {"crop_size": args.crop}
            else:
                size = tuple(args.sliding_size)
                options = {"scheme": SlidingScheme(args.window, stride, "shift", "logits")}
            image = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(2)).to(device)
            for head, t in cases_for(mode, args.ts):
                name = f"{mode}/{head}/T={t}"
                num_samples = None if head == "baseline" else t
                cases[name] = (lambda m=models[head], x=image, md=mode, n=num_samples, o=options:
                               predict(m, x, mode=md, num_samples=n, **o))
                settings[name] = {"eval_mode": mode, "head": head, "num_samples": t, "image_size": list(size),
                                  "num_classes": num_classes,
                                  **({"window": args.window, "stride": stride,
                                      "windows": len(sliding_windows(*size, options["scheme"]))}
                                     if mode != "center_crop" else {"crop_size": args.crop})}
        # warm-up: each model's cheapest case (T=1), so the costly large-T cases run only when timed
        for name, case in cases.items():
            if name.endswith("/T=1"):
                for _ in range(args.warmup):
                    case()

        def progress(round_index: int, so_far: dict) -> None:
            print(json.dumps({"benchmark": "uncertainty_time", "event": "round", "round": round_index,
                              "seconds": {n: round(t.seconds[-1], 3) for n, t in so_far.items()},
                              "cpu_seconds": {n: round(t.cpu_seconds[-1], 3) for n, t in so_far.items()},
                              "loadavg": machine().get("loadavg")}), file=sys.stderr, flush=True)

        timings = time_interleaved(cases, repeats=args.repeats, warmup=0, device=device, on_round=progress)
        for name, timing in timings.items():
            record = {"benchmark": "uncertainty_time", **settings[name], "uncertainty_seconds": timing.median,
                      "seconds": [round(s, 4) for s in timing.seconds], "cpu_median": timing.cpu_median,
                      "cpu_seconds": [round(s, 4) for s in timing.cpu_seconds], "backbone": args.backbone,
                      "variant": "u2pl", "device": str(device), "threads": args.threads}
            records.append(record)
            print(json.dumps(record), flush=True)

    for measure in ("uncertainty_seconds", "cpu_median"):  # wall clock, and process CPU (steadier when shared)
        crop = {(r["head"], r["num_samples"]): r[measure] for r in records if r["eval_mode"] == "center_crop"}
        for name, numerator, denominator, bound, kind in TARGETS:
            if numerator in crop and denominator in crop:
                ratio = crop[numerator] / crop[denominator]
                met = ratio <= bound if kind == "max" else ratio >= bound
                print(json.dumps({"benchmark": "uncertainty_time", "target": name, "measure": measure,
                                  "ratio": round(ratio, 3), "bound": bound, "kind": kind, "met": met}), flush=True)
    print(json.dumps({"benchmark": "uncertainty_time", "event": "end", **machine()}), flush=True)
    if records:
        plot(records, args.figure)
    if records and args.tracking_uri:
        for run_id in log_series(records, args.tracking_uri, args.experiment):
            print(json.dumps({"benchmark": "uncertainty_time", "event": "logged", "run_id": run_id,
                              "experiment": args.experiment}), flush=True)
    return 0


def log_series(records: list[dict], tracking_uri: str, experiment: str) -> list[str]:
    """One FINISHED MLflow run per (evaluation mode, head): ``uncertainty_seconds`` at step T (the
    schema of :func:`semiseg_platform.reports.log_uncertainty_time_run`); returns the run ids."""
    from semiseg_platform.reports import log_uncertainty_time_run

    series: dict[tuple[str, str], dict[int, float]] = {}
    for record in records:
        series.setdefault((record["eval_mode"], record["head"]), {})[record["num_samples"]] = record["uncertainty_seconds"]
    first = {(r["eval_mode"], r["head"]): r for r in records}
    run_ids = []
    for (mode, head), seconds_by_t in sorted(series.items()):
        record = first[(mode, head)]
        tags = {"device": record["device"], "backbone": record["backbone"], "threads": str(record["threads"]),
                "image_size": "x".join(map(str, record["image_size"])), "num_classes": str(record["num_classes"])}
        run_ids.append(log_uncertainty_time_run(tracking_uri, experiment, head=head, eval_mode=mode,
                                                seconds_by_t=seconds_by_t, framework=record["variant"], tags=tags))
    return run_ids


if __name__ == "__main__":
    sys.exit(main())

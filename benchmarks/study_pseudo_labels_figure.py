"""Draws the pseudo-label diagnostics of ``benchmarks/study_gap.py``: not a test
(results: ``docs/learning.md``, "One class given away").

Reads study_gap's JSON lines, each with a ``run`` label added, and draws, per dataset and training seed, the supervised
reference's per-class IoU during its run (``--set schedule.eval_every_epochs=10``) beside the PS-MT teacher's
per-class pseudo-label recall by quarter (``--set data.unlabeled_truth=measured``) for each PS-MT run, and the
confusion of one run's pseudo-labels against the truth.

Usage::

    .venv/bin/python benchmarks/study_pseudo_labels_figure.py benchmarks/figures/study_pseudo_labels_s12.jsonl \\
        --out benchmarks/figures/study_pseudo_labels_s12.png
"""

from __future__ import annotations

import argparse
import json

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"stripes": "tab:blue", "dots": "tab:red", "grid": "tab:green", "waves": "tab:orange"}
STYLES = ("--", ":", "-.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines", help="study_gap JSON lines with a 'run' label each")
    parser.add_argument("--reference", default="supervised_psmt tune curve", help="run label of the IoU curves")
    parser.add_argument("--teachers", nargs="+", default=["psmt tune rampup18", "psmt tune rampup30 (diagnostic)"])
    parser.add_argument("--confusion", default="psmt val rampup18", help="run label of the confusion panel")
    parser.add_argument("--confusion-data-seed", type=int, default=2)
    parser.add_argument("--ramps", nargs="*", type=int, default=[144, 240], help="steps to mark")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.lines)]
    references = [r for r in rows if r["run"] == args.reference]
    fig, axes = plt.subplots(1, len(references) + 1, figsize=(5 * (len(references) + 1), 4.2))
    for ax, reference in zip(axes, references):
        data_seed, seed, steps = reference["data_seed"], reference["seed"], reference["steps"]
        evaluations = reference["evaluations"]
        for name, color in COLORS.items():
            ax.plot([e["step"] for e in evaluations], [e[name] for e in evaluations], color=color,
                    label=f"{args.reference}: IoU {name}")
        for label, style in zip(args.teachers, STYLES):
            for run in (r for r in rows if r["run"] == label and (r["data_seed"], r["seed"]) == (data_seed, seed)):
                middles = [(q + 0.5) * steps / 4 for q in range(4)]
                for name, color in COLORS.items():
                    ax.plot(middles, run["per_quarter"][f"pseudo_label_recall/{name}"], style, color=color,
                            marker="o", ms=3)
        for i, step in enumerate(args.ramps):
            ax.axvline(step, color="grey", lw=0.8)
            ax.text(step + 4, 0.02 + 0.05 * i, f"step {step}", fontsize=7, color="grey")
        ax.set_title(f"data seed {data_seed}, seed {seed}: IoU (solid), teacher recall by quarter\n"
                     + "; ".join(f"{s} {t}" for t, s in zip(args.teachers, STYLES)), fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7, loc="upper right")
    run = next(r for r in rows if r["run"] == args.confusion and r["data_seed"] == args.confusion_data_seed)
    names = ["background", *COLORS]
    shares = np.array([[run["pseudo_label_confusion"].get(t, {}).get(p, 0.0) for p in names] for t in names])
    ax = axes[-1]
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for (i, j), share in np.ndenumerate(shares):
        if share >= 0.01:
            ax.text(j, i, f"{share:.2f}", ha="center", va="center", fontsize=7, color="white" if share > 0.5 else "black")
    ax.set_xlabel("pseudo-label")
    ax.set_ylabel("true class")
    ax.set_title(f"{args.confusion}, data seed {args.confusion_data_seed}:\nthe run's pseudo-labels against the truth",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()

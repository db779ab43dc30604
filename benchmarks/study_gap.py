"""The label gap of the study dataset, and the mini-study's cells by hand: not a test (results: ``docs/learning.md``).

Trains the mini-study's ``supervised`` / ``baseline`` cells at 1/16 and with all labels
(``full``), exactly as ``jobs/specs/mini.yaml`` configures them (pretrained start, schedule,
evaluation on the 200 validation images), and prints one JSON line per cell: mIoU, pixel
accuracy, seconds, load average. What to look for: 1/16 below ``full`` on every dataset seed
(``--data-seeds``), otherwise unlabeled data has nothing to add. No size of the gap is a target: the
15 points once asked for are retired (``docs/history/learning.md``, "The label-gap target, retired").

Usage::

    .venv/bin/python benchmarks/study_gap.py                               # seed 0, data seed 0
    .venv/bin/python benchmarks/study_gap.py --seeds 0,1,2 --data-seeds 0,1 --set schedule.max_steps=160
    # the input the probe (benchmarks/study_probe.py) found learns shape: whole images, batch 8, no rescale
    .venv/bin/python benchmarks/study_gap.py --set model.weights=null --set schedule.max_steps=300 \
        --set schedule.batch_size=8 --set schedule.crop_size=64 --set data.augmentation.resize=none
    # any other cells of the spec (e.g. an SSL framework against supervised), scored on the tune split
    .venv/bin/python benchmarks/study_gap.py --frameworks supervised,mt --partitions 1/16 --set evaluation.split=tune
    # the pseudo-label diagnostics: the teacher's accuracy on the unlabeled images, or the truth in its place
    .venv/bin/python benchmarks/study_gap.py --frameworks mt --partitions 1/16 --set data.unlabeled_truth=measured
    # when supervised learns each class: per-class IoU on the tune split every 10 epochs (80 steps)
    .venv/bin/python benchmarks/study_gap.py --partitions 1/16 --set evaluation.split=tune --set schedule.eval_every_epochs=10
    # another run length: the time-dependent framework settings follow npsemiseg.short_run's rule for it
    .venv/bin/python benchmarks/study_gap.py --frameworks mt --partitions 1/16 --steps 960
    # the evaluated model again after re-estimating its batch-norm statistics on 256 clean training images
    .venv/bin/python benchmarks/study_gap.py --frameworks augseg --partitions 1/16 --recalibrate-bn 256

Each line also gives, per quarter of the run, the mean of the step logs that say whether the
unsupervised term was at work: ``pseudo_label_accuracy`` and ``pseudo_label_class_accuracy``
(under ``data.unlabeled_truth`` measured / oracle), ``kept_fraction`` and ``teacher_confidence``
(where the framework logs them), per class ``pseudo_label_recall/<class>`` and ``pseudo_label_precision/<class>``
(which class the teacher loses, and to which), and the largest gradient norm of the run with its step (one
exploding step can undo a run: U2PL seed 1, ``docs/learning.md``). Under measured / oracle it also gives the
run's ``pseudo_label_confusion``: for each true class, the shares of its pixels given each pseudo-label.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig, with_overrides
from npsemiseg.frameworks import get_framework
from npsemiseg.short_run import EMA_DECAYS, EPOCH_PHASES, QUEUES, RunLength, scale_time_settings
from npsemiseg.training import train
from npsemiseg.training.artifacts import evaluate_model
from npsemiseg.training.factories import build_datasets
from npsemiseg.training.plan import plan_run
from semiseg_platform.sweeps.grid_spec import expand, load_spec

SPEC = Path(__file__).resolve().parents[1] / "jobs" / "specs" / "mini.yaml"
#: step logs summarised per quarter of the run, and the per-class ones (``<prefix><class index>``)
TRACED = ("pseudo_label_accuracy", "pseudo_label_class_accuracy", "kept_fraction", "teacher_confidence")
TRACED_PER_CLASS = ("pseudo_label_recall/", "pseudo_label_precision/")


class StepTrace(Callbacks):
    """Collects the traced step logs; ``quarters()`` = their means over each quarter of the steps."""

    def __init__(self) -> None:
        self.steps: dict[str, list[tuple[int, float]]] = {}
        self.largest_gradient = (0.0, 0)  # (train/grad_norm, step)
        self.evaluations: list[dict[str, float]] = []  # mIoU and per-class IoU at each evaluation during the run

    def on_step(self, step: int, total_steps: int, logs: dict[str, float]) -> None:
        self.total = total_steps
        self.largest_gradient = max(self.largest_gradient, (logs.get("train/grad_norm", 0.0), step))
        for name, value in logs.items():
            key = name.removeprefix("train/")
            if key in TRACED or key.startswith(TRACED_PER_CLASS):
                self.steps.setdefault(key, []).append((step, value))

    def on_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        self.evaluations.append({"step": step, "miou": round(metrics["miou"], 4),
                                 **{k[4:]: round(v, 3) for k, v in metrics.items() if k.startswith("iou/")}})

    def quarters(self, class_names: tuple[str, ...]) -> dict[str, list[float]]:
        summary = {}
        for key, values in sorted(self.steps.items()):
            prefix, _, index = key.rpartition("/")
            key = f"{prefix}/{class_names[int(index)]}" if prefix else key
            parts = [[v for s, v in values if q * self.total < 4 * s <= (q + 1) * self.total] for q in range(4)]
            summary[key] = [round(sum(p) / len(p), 3) if p else None for p in parts]
        return summary


def confusion_shares(framework, class_names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """The run's pseudo-labels against the truth (``data.unlabeled_truth`` measured / oracle): for every true
    class, the shares of its pixels given each pseudo-label (1 % and more); empty when nothing was measured."""
    confusion = getattr(framework, "pseudo_label_confusion", None)
    if confusion is None or int(confusion.sum()) == 0:
        return {}
    rows = confusion.double() / confusion.sum(dim=1, keepdim=True).clamp_min(1)
    return {class_names[t]: {class_names[p]: round(float(share), 3) for p, share in enumerate(row) if share >= 0.01}
            for t, row in enumerate(rows) if int(confusion[t].sum()) > 0}


def at_length(config: RunConfig, steps: int) -> dict[str, str]:
    """Overrides that make ``config`` ``steps`` long, its time-dependent framework settings scaled by the rule
    (``npsemiseg.short_run``) for that length, as the spec's ``cell_overrides`` are for its own."""
    schedule, info = config.schedule, config.dataset_info
    labeled = info.partitions[config.partition]
    epoch = plan_run(config, num_labeled=labeled, num_unlabeled=info.train_size - labeled, world_size=1)
    run = RunLength.of(steps=steps, iters_per_epoch=epoch.iters_per_epoch,
                       images_per_step=schedule.batch_size + schedule.unlabeled_batch_size, crop_size=schedule.crop_size)
    paper = get_framework(config.framework).paper_options(config.dataset, config.partition)
    scaled = {**paper, **scale_time_settings(paper, run)}
    timed = [k for k in paper if k in EPOCH_PHASES + EMA_DECAYS + QUEUES]  # also undoes the spec's own scaling
    return {"schedule.max_steps": str(steps), **{f"framework_options.{k}": json.dumps(scaled[k]) for k in timed}}


def recalibrated_miou(result, config: RunConfig, images: int) -> float:
    """mIoU of the evaluated model after re-estimating its batch-norm running statistics (cumulative average)
    on ``images`` clean unlabeled training images: do the strong views hurt the statistics or the weights?"""
    model = result.framework.eval_model()
    datasets = build_datasets(config)
    unlabeled = datasets["unlabeled"]
    model.eval()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None
            module.train()
    with torch.no_grad():
        for start in range(0, images, 8):
            model(torch.stack([unlabeled[i]["image"] for i in range(start, min(start + 8, images))]))
    model.eval()
    return evaluate_model(model, datasets["val"], config, step=result.steps, device=torch.device("cpu"))["miou"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(SPEC))
    parser.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    parser.add_argument("--data-seeds", default="0", help="dataset instances (data.options.seed), comma-separated")
    parser.add_argument("--set", action="append", default=[], help="extra dotted override key=value")
    parser.add_argument("--frameworks", default="supervised", help="frameworks of the spec's cells, comma-separated")
    parser.add_argument("--heads", default="baseline", help="head names of the spec's cells, comma-separated")
    parser.add_argument("--partitions", default="", help="partitions (default: all of the spec's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="run length (time-dependent settings by the rule)")
    parser.add_argument("--recalibrate-bn", type=int, default=0, metavar="N",
                        help="also report the mIoU after re-estimating BN statistics on N clean training images")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    seeds = {int(s) for s in args.seeds.split(",")}
    extra = dict(item.split("=", 1) for item in args.set)
    frameworks, heads = set(args.frameworks.split(",")), set(args.heads.split(","))
    partitions = set(args.partitions.split(",")) if args.partitions else None
    cells = [c for c in expand(load_spec(args.spec)) if c.framework_label in frameworks and c.head.label in heads
             and c.seed in seeds and (partitions is None or c.partition in partitions)]
    for data_seed in (int(s) for s in args.data_seeds.split(",")):
        for config in cells:
            length = at_length(config, args.steps) if args.steps else {}
            config = with_overrides(config, {"data.options.seed": str(data_seed), "runtime.progress": "off", **length,
                                            **extra})
            start = time.perf_counter()
            trace = StepTrace()
            result = train(config, trace)
            print(json.dumps({"framework": config.framework, "head": config.head.label,
                              "partition": config.partition, "seed": config.seed, "data_seed": data_seed,
                              "split": config.evaluation.split, "steps": result.steps, "miou": round(result.metrics["miou"], 4),
                              "pixel_acc": round(result.metrics["pixel_acc"], 4),
                              "per_class_iou": {k[4:]: round(v, 3) for k, v in result.metrics.items() if k.startswith("iou/")},
                              "truth": config.data.unlabeled_truth,
                              "per_quarter": trace.quarters(config.dataset_info.class_names),
                              "pseudo_label_confusion": confusion_shares(result.framework,
                                                                         config.dataset_info.class_names),
                              "largest_grad_norm": {"norm": round(trace.largest_gradient[0], 2),
                                                    "step": trace.largest_gradient[1]},
                              **({"evaluations": trace.evaluations} if trace.evaluations else {}),
                              "seconds": round(time.perf_counter() - start), "load": os.getloadavg()[0],
                              **({"miou_bn_recalibrated": round(recalibrated_miou(result, config, args.recalibrate_bn), 4)}
                                 if args.recalibrate_bn else {})}), flush=True)


if __name__ == "__main__":
    main()

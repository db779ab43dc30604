"""A cell on the GPUs a run gets: processes x per-process batch x accumulation steps that keep the publication's
global batch, the predicted peak memory per GPU, and what differs from the publication. Torch-free (a table).

The memory model (``memory_model.json``, written by ``benchmarks/memory_model.py``): a step's peak is the model
state (every network's parameters and buffers, plus the student's trainable parameters once more for their
gradients and once or twice for SGD's momentum or AdamW's moments: counted on fake tensors) plus activations in
proportion to the pixels of the step's images, per framework x head, fitted to one measured GPU step (bf16
autocast; ``measured`` entries, from ``docs/performance.md``). A float32 cell's activations count twice;
ResNet-50 cells take ResNet-101's activations per pixel (an upper bound); ``fixmatch_v2`` takes
``unimatch_v2``'s (its step is a subset of it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from npsemiseg.config import RunConfig, with_overrides

#: the CUDA context and libraries, outside the allocator's count (MiB), and the allocator's share lost to
#: rounding and fragmentation: a plan fits when its predicted peak <= memory x (1 - share) - context
CONTEXT_MIB = 1024
FRAGMENTATION = 0.10
#: GPU memory sizes (GB) sold, for the one-line "smallest GPU that would" answer
GPU_SIZES_GB = (8, 12, 16, 24, 32, 40, 48, 80, 96, 141, 192)
_GPUS = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?)\s*(GB|GiB|G)\s*$", re.IGNORECASE)
#: frameworks measured on another's step (a subset of it)
_STAND_INS = {"fixmatch_v2": "unimatch_v2"}
_PROXY_BACKBONE = {"resnet50": "resnet101"}


@dataclass(frozen=True)
class Gpus:
    """``count`` GPUs of ``memory_gb`` each (as sold: ``24GB``)."""

    count: int
    memory_gb: float

    @property
    def usable_mib(self) -> float:
        return self.memory_gb * 1024 * (1 - FRAGMENTATION) - CONTEXT_MIB

    def __str__(self) -> str:
        return f"{self.count}x{self.memory_gb:g}GB"


def parse_gpus(text: str) -> Gpus:
    """``"2x24GB"`` -> ``Gpus(2, 24)``; ``ValueError`` naming the value and the form expected."""
    match = _GPUS.match(text or "")
    if not match or int(match.group(1)) < 1 or float(match.group(2)) <= 0:
        raise ValueError(f"--gpus: expected COUNTxMEMORY, e.g. 2x24GB or 8x80GB, got {text!r}")
    return Gpus(int(match.group(1)), float(match.group(2)))


@cache
def memory_table() -> dict[str, Any]:
    return json.loads(resources.files("npsemiseg").joinpath("memory_model.json").read_text())


def _uses_unlabeled(config: RunConfig) -> bool:
    return config.framework != "supervised"


def _state_mib(state: dict[str, float], optimizer: str, momentum: float) -> float:
    """Parameters and buffers, plus a gradient and the optimiser's slots per trainable parameter."""
    slots = 2 if optimizer == "adamw" else (1 if momentum > 0 else 0)
    return state["held_mib"] + state["trainable_mib"] * (1 + slots)


def predict_peak_mib(config: RunConfig, labeled: int, unlabeled: int) -> float:
    """The predicted peak MiB of one process's step of ``config`` on ``labeled`` + ``unlabeled`` images."""
    table = memory_table()
    framework, head, backbone = config.framework, config.head.name, config.model.backbone
    state = table["state"].get(f"{framework}|{head}|{backbone}")
    if state is None:
        raise ValueError(f"memory model: no entry for {framework} x {head} x {backbone} "
                         "(benchmarks/memory_model.py adds it)")
    static = _state_mib(state, config.optim.name, config.optim.momentum)
    measured_backbone = _PROXY_BACKBONE.get(backbone, backbone)
    own = f"{framework}|{head}|{measured_backbone}" in table["measured"]
    measured_framework = framework if own else _STAND_INS.get(framework, framework)
    measured = table["measured"].get(f"{measured_framework}|{_measured_head(config)}|{measured_backbone}",
                                     table["measured"].get(f"{measured_framework}|{head}|{measured_backbone}"))
    if measured is None:
        raise ValueError(f"memory model: no measured step for {measured_framework} x {head} x {measured_backbone}")
    images = labeled + (unlabeled if _uses_unlabeled(config) else 0)
    measured_state = table["state"][f"{measured_framework}|{head}|{measured_backbone}"]
    activation = measured["peak_mib"] - _state_mib(measured_state, measured["optim"], 0.9)
    per_pixel = activation / (measured["images"] * measured["crop"] ** 2)
    precision = 1.0 if config.runtime.amp else 2.0
    return static + per_pixel * images * config.schedule.crop_size ** 2 * precision


def _measured_head(config: RunConfig) -> str:
    """The measured step's head key: the NP head on a pooled map (``feature_pool`` not 1: ``coarse`` is 4 on the
    DPT) has its own, since its activations are the pooled map's (a third of the full map's on DINOv2-S). Where no
    step was measured at that pool, the caller falls back to the full map's (an over-estimate)."""
    pool = config.head.options.get("feature_pool", 1) if config.head.name == "np" else 1
    return config.head.name if pool == 1 else f"np@{pool}"


@dataclass(frozen=True)
class HardwarePlan:
    """``processes`` x ``batch`` (+ ``unlabeled_batch``) x ``accumulation_steps`` on ``gpus``: the publication's
    global batch kept, or ``fits=False`` with the smallest GPU that would take one image per micro-batch."""

    gpus: Gpus
    fits: bool
    processes: int = 0
    batch: int = 0
    unlabeled_batch: int = 0
    accumulation_steps: int = 1
    global_batch: int = 0
    peak_mib: float = 0.0
    smallest_gpu_gb: float | None = None
    differences: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line: the plan, or why none fits."""
        if not self.fits:
            needed = f"{self.smallest_gpu_gb:g}GB" if self.smallest_gpu_gb else "more than any GPU sold"
            return (f"no plan on {self.gpus}: one micro-batch needs {self.peak_mib / 1024:.1f} GiB per GPU "
                    f"(predicted); the smallest GPU that would: {needed}")
        unlabeled = f" + {self.unlabeled_batch}" if self.unlabeled_batch else ""
        processes = f"{self.processes} process{'es' if self.processes > 1 else ''}"
        return (f"{processes} x batch {self.batch}{unlabeled} x {self.accumulation_steps} "
                f"accumulation steps = global batch {self.global_batch}; predicted peak "
                f"{self.peak_mib / 1024:.1f} GiB of {self.gpus.memory_gb:g} GB per GPU")

    def params(self) -> dict[str, str]:
        """The plan as MLflow params (``plan/...``)."""
        return {"plan/gpus": str(self.gpus), "plan/fits": str(self.fits), "plan/processes": str(self.processes),
                "plan/batch": str(self.batch), "plan/unlabeled_batch": str(self.unlabeled_batch),
                "plan/accumulation_steps": str(self.accumulation_steps), "plan/global_batch": str(self.global_batch),
                "plan/predicted_peak_mib": f"{self.peak_mib:.0f}"}


def publication_batches(config: RunConfig) -> tuple[int, int, int]:
    """``(global labeled batch, per-process labeled, per-process unlabeled)`` of the publication: the preset's
    ``optim.reference_batch`` (else the cell's per-process batch on one process)."""
    schedule = config.schedule
    unlabeled = (schedule.unlabeled_batch_size or schedule.batch_size) if _uses_unlabeled(config) else 0
    return config.optim.reference_batch or schedule.batch_size, schedule.batch_size, unlabeled


def plan_cell(config: RunConfig, gpus: Gpus) -> HardwarePlan:
    """The plan with the most processes, then the fewest accumulation steps, whose predicted peak fits."""
    global_batch, batch0, unlabeled0 = publication_batches(config)
    for processes in range(min(gpus.count, global_batch), 0, -1):
        if global_batch % processes:
            continue
        per_process = global_batch // processes
        for steps in (k for k in range(1, per_process + 1) if per_process % k == 0):
            batch = per_process // steps
            if (batch * unlabeled0) % batch0:
                continue
            unlabeled = batch * unlabeled0 // batch0
            peak = predict_peak_mib(config, batch, unlabeled)
            if peak <= gpus.usable_mib:
                return HardwarePlan(gpus, True, processes, batch, unlabeled, steps, global_batch, peak,
                                    differences=differences(config, processes, batch, unlabeled, steps))
    return _no_plan(config, gpus, batch0, unlabeled0)


def _no_plan(config: RunConfig, gpus: Gpus, batch0: int, unlabeled0: int) -> HardwarePlan:
    batch = next(b for b in range(1, batch0 + 1) if (b * unlabeled0) % batch0 == 0)
    peak = predict_peak_mib(config, batch, batch * unlabeled0 // batch0)
    needed_gb = (peak + CONTEXT_MIB) / (1 - FRAGMENTATION) / 1024
    smallest = next((size for size in GPU_SIZES_GB if size >= needed_gb), None)
    return HardwarePlan(gpus, False, peak_mib=peak, smallest_gpu_gb=smallest)


def differences(config: RunConfig, processes: int, batch: int, unlabeled: int, steps: int) -> list[str]:
    """What a plan changes against the publication: processes, per-process batch, accumulation, and the images
    batch normalisation sees per forward pass (one micro-batch; SyncBN across the processes)."""
    global_batch, batch0, unlabeled0 = publication_batches(config)
    processes0 = max(global_batch // batch0, 1)
    out = []
    if (processes, batch, unlabeled) != (processes0, batch0, unlabeled0):
        out.append(f"processes {processes} x batch {batch} + {unlabeled} (publication {processes0} x "
                   f"{batch0} + {unlabeled0})")
    if steps > 1:
        out.append(f"{steps} micro-batches per optimiser step: gradients summed to the published global batch; "
                   "batch statistics, thresholds and per-batch loss means see one micro-batch")
    sync = config.runtime.sync_bn
    group, group0 = batch * (processes if sync else 1), batch0 * (processes0 if sync else 1)
    if group != group0:
        how = "SyncBN across the processes" if sync else "per process"
        out.append(f"batch normalisation over {group} labeled images per forward ({how}; publication {group0})")
    return out


def run_record(config: RunConfig, processes: int) -> dict[str, str]:
    """What a run of ``config`` on ``processes`` processes does against the publication, as strings (the cell's
    MLflow params): processes, per-process batches, accumulation steps, the global batch it trains at and the
    publication's, and the predicted peak per GPU (``unknown`` without a memory-model entry)."""
    schedule = config.schedule
    global_batch, batch0, unlabeled0 = publication_batches(config)
    unlabeled = (schedule.unlabeled_batch_size or schedule.batch_size) if _uses_unlabeled(config) else 0
    try:
        peak = f"{predict_peak_mib(config, schedule.batch_size, unlabeled):.0f}"
    except ValueError:
        peak = "unknown"
    return {"processes": str(processes), "batch": str(schedule.batch_size), "unlabeled_batch": str(unlabeled),
            "accumulation_steps": str(schedule.accumulation_steps),
            "global_batch": str(schedule.batch_size * processes * schedule.accumulation_steps),
            "publication_global_batch": str(global_batch), "predicted_peak_mib": peak}


@dataclass(frozen=True)
class Replan:
    """A plan re-made for the world size a run actually got: the per-process ``batch`` / ``unlabeled_batch``
    and ``accumulation_steps`` on ``processes``, and ``global_batch`` (``kept`` when it is the planned one)."""

    processes: int
    batch: int
    unlabeled_batch: int
    accumulation_steps: int
    global_batch: int
    planned_global_batch: int

    @property
    def kept(self) -> bool:
        return self.global_batch == self.planned_global_batch

    def overrides(self) -> dict[str, int]:
        """The configuration overrides that run it."""
        return {"schedule.batch_size": self.batch, "schedule.unlabeled_batch_size": self.unlabeled_batch,
                "schedule.accumulation_steps": self.accumulation_steps}

    def record(self) -> dict[str, str]:
        """As the cell's record (``plan.obtained.*`` tags: a world size obtained after the run opened)."""
        return {"world_size": str(self.processes), "batch": str(self.batch),
                "unlabeled_batch": str(self.unlabeled_batch), "accumulation_steps": str(self.accumulation_steps),
                "global_batch": str(self.global_batch), "global_batch_kept": str(self.kept)}


def replan_for_world_size(config: RunConfig, planned_processes: int, world_size: int) -> Replan:
    """``config`` was planned for ``planned_processes`` (global batch = batch x processes x accumulation steps);
    the run got ``world_size`` processes (an elastic run that lost or gained workers). The largest micro-batch up
    to the configured one whose accumulation keeps that global batch; when ``world_size`` does not divide it, the
    configured micro-batch with the accumulation steps that come nearest (not ``kept``)."""
    schedule = config.schedule
    unlabeled = schedule.unlabeled_batch_size or schedule.batch_size
    planned = schedule.batch_size * planned_processes * schedule.accumulation_steps
    for batch in range(schedule.batch_size, 0, -1):
        if planned % (world_size * batch) == 0 and (batch * unlabeled) % schedule.batch_size == 0:
            steps = planned // (world_size * batch)
            return Replan(world_size, batch, batch * unlabeled // schedule.batch_size, steps, planned, planned)
    steps = max(1, round(planned / (world_size * schedule.batch_size)))
    return Replan(world_size, schedule.batch_size, unlabeled, steps, world_size * schedule.batch_size * steps,
                  planned)


def replanned_config(config: RunConfig, planned_processes: int, world_size: int) -> tuple[RunConfig, Replan]:
    """``config`` (planned for ``planned_processes``) re-planned for the ``world_size`` a run got, and the re-plan:
    its per-process batches and accumulation steps from :func:`replan_for_world_size`, the planned ones kept in
    ``runtime.planned_schedule`` so that the cell id, and with it the checkpoints the run resumes, stay the cell's."""
    replan = replan_for_world_size(config, planned_processes, world_size)
    schedule = config.schedule
    if (replan.batch, replan.accumulation_steps) == (schedule.batch_size, schedule.accumulation_steps):
        return config, replan
    planned = config.runtime.planned_schedule or {
        "batch_size": schedule.batch_size, "unlabeled_batch_size": schedule.unlabeled_batch_size,
        "accumulation_steps": schedule.accumulation_steps}
    return with_overrides(config, {**replan.overrides(), "runtime.planned_schedule": planned}), replan


def elastic_world_size_problem(config: RunConfig, min_processes: int, max_processes: int) -> str | None:
    """Why ``config``, planned for ``max_processes``, cannot keep its global batch on some world size down to
    ``min_processes`` (one line naming it and the sizes that would), or None when every one keeps it."""
    keeping = [size for size in range(1, max_processes + 1) if replan_for_world_size(config, max_processes, size).kept]
    lost = [size for size in range(min_processes, max_processes + 1) if size not in keeping]
    if not lost:
        return None
    planned = config.schedule.batch_size * max_processes * config.schedule.accumulation_steps
    return (f"the global batch {planned} (batch {config.schedule.batch_size} x {max_processes} workers x "
            f"{config.schedule.accumulation_steps} accumulation steps) cannot be kept on {lost[0]} worker(s); "
            f"world sizes that keep it: {keeping}")

"""GPU acceptance run: one paper-scale training step of every framework x head, a one-rank DDP cell, evaluate and
predict on the device, and the GPU-hours of ``jobs/specs/paper.yaml`` from the measured step times.

Meant for the first hour on a GPU (``make gpu-check``; at most 8 minutes on one H100) and kept from rotting by
``tests/test_gpu_acceptance.py``, which runs the same code path with ``--device cpu --tiny``.

1. Steps. Every framework x head is built and stepped through the project's own APIs: the configuration of
   ``npsemiseg.config.cell_config`` (preset ``paper``: crop 480, 3 labeled + 3 unlabeled images per GPU on VOC,
   bf16 autocast as ``runtime.amp`` says; ``--backbone`` resnet101 by default, random init, ``model.weights=None``)
   on the synthetic VOC stand-in at VOC's image size (375 x 500), ``npsemiseg.training.setup.setup_run`` (datasets,
   framework on the device, optimiser, data streams) and ``npsemiseg.training.step.train_step`` (the loop's step).
   The frameworks' supervised-only / warm-up phases are set to 0 so the step measured is the semi-supervised one.
   The batches are drawn from the run's data streams before timing (once per framework: the head changes no data
   setting); one warm-up step (its time reported as the first step's), then ``--steps`` timed steps
   (CUDA synchronised around each): step time (median; on CPU also the process's CPU seconds), images/s, peak
   memory (``torch.cuda.max_memory_allocated`` on CUDA, the process's peak RSS on CPU, reset per cell), and per
   framework the NP / baseline and MC dropout / baseline ratios. The ``supervised`` row is every framework's
   supervised-only phase (labeled images only). ``--host-work`` counts one more step's operator calls and reads of device values
   (``host_work.py``; a small batch's step is bound by the host), with NP / baseline ratios; ``--crop`` and
   ``--steps-only`` make that count a CPU run of a minute, ``--np-samples-per-conv`` counts the CUDA path on CPU;
   ``--np-keep-first-stage`` keeps the NP decoder's first stage for backward (the memory / time trade).
2. DDP. ``torch.distributed`` with world size 1 (NCCL on CUDA, gloo on CPU) and the project's loop
   (``npsemiseg.training.train``) for ``--ddp-steps`` steps of U2PL x NP (NP memory sync and the contrastive queues
   see an initialised process group), then the project's collectives (``broadcast_state``, ``average_gradients``)
   on the trained student and an all-reduce checked for its value.
3. Inference. The DDP cell's trained framework's evaluation model as ``npsemiseg.inference_model.SegmentationModel``
   on the device: ``predict`` on a batch of VOC-sized images, ``evaluate`` on the validation split
   (``npsemiseg.evaluation`` underneath), ``export`` then ``load_model`` back onto the device, predictions equal.
4. GPU-hours. ``jobs/specs/paper.yaml`` expanded with ``semiseg_platform.sweeps.grid_spec``; steps per cell from
   ``npsemiseg.training.plan.plan_run`` (the cell's epochs x iterations per epoch on ``resources.workers`` GPUs,
   the packaged partition lists' labeled / unlabeled counts); each cell's step time is the measured one of its
   framework x head scaled by pixels per step (crop^2 x images per GPU: Cityscapes' 2 + 2 at 580 and the
   per-head publication settings); GPU-hours = steps x step time x GPUs / 3600. Assumptions are in the output.
5. UniMatch V2 on DINOv2 (``--vit dinov2_s dinov2_b``): a ``unimatch_v2`` step per head on each ViT (random init,
   no weights download; the ``paper`` preset's UniMatch V2 settings: crop 518, 4 + 4 images per GPU, AdamW), with
   time, memory and the NP / baseline ratios, and the GPU-hours of ``jobs/specs/paper_unimatch_v2.yaml``
   (``--vit-spec``) from them (each spec cell at its backbone's measured step). ``--tiny``: ``vit_tiny`` at 28 px.

    python benchmarks/gpu_acceptance.py                          # on a GPU (make gpu-check)
    python benchmarks/gpu_acceptance.py --device cpu --tiny      # the same path on CPU in seconds
    python benchmarks/gpu_acceptance.py --device cpu --crop 64 --steps-only --host-work --heads baseline np
    python benchmarks/gpu_acceptance.py --frameworks unimatch_v2 --vit dinov2_s dinov2_b   # + UniMatch V2 on DINOv2
    python benchmarks/gpu_acceptance.py --compile default --steps-only   # + each cell again with runtime.compile

6. Compiled steps (``--compile MODE``: ``runtime.compile``, ``npsemiseg.models.compile``): each framework x head is
   measured again with its networks compiled, right after its eager measurement on the same batches; the compiled
   cell's first step (compilation) is reported apart from its timed steps, and the eager / compiled step-time
   ratio per cell; with ``--host-work`` the compiled cell's counts beside eager's (so far equal to them: under the
   counter's dispatch and function modes the compiled frames ran as eager, ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import itertools
import json
import os
import platform
import shlex
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from npsemiseg.config import RunConfig, cell_config
from npsemiseg.data import dataset_info
from npsemiseg.data.partitions import partition_ids
from npsemiseg.frameworks import StepContext, framework_names, get_framework
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.heads import head_names
from npsemiseg.heads.np_layers import NPDecoder
from npsemiseg.inference_model import SegmentationModel, load_model
from npsemiseg.models import COMPILE_MODES
from npsemiseg.models.vit import is_vit_backbone, vit_backbone_names
from npsemiseg.training import average_gradients, broadcast_state, plan_run, train
from npsemiseg.training.setup import backend_flags, setup_run
from npsemiseg.training.step import train_step

from host_work import HostWork

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_acceptance"
DEFAULT_SPEC = ROOT / "jobs" / "specs" / "paper.yaml"
DEFAULT_VIT_SPEC = ROOT / "jobs" / "specs" / "paper_unimatch_v2.yaml"
#: the framework measured on the ViTs (``--vit``), at the paper preset's crop; in tiny mode the tiny ViT's settings
VIT_FRAMEWORK, VIT_CROP = "unimatch_v2", 518
TINY_VIT = {"model.backbone": "vit_tiny", "schedule.crop_size": 28, "evaluation.resize_multiple": 14}
DATASET = "synthetic_voc"
#: a VOC partition whose synthetic stand-in has enough labeled images for a batch of 3
PARTITION = "1464"
#: VOC's usual image size (rows, columns)
VOC_IMAGE = (375, 500)
TINY_IMAGE = (48, 64)
DDP_CELL = ("u2pl", "np")


def machine(device: torch.device) -> str:
    """The GPU's name, else the CPU model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cell_overrides(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The overrides of every measured cell: device, random init, synthetic VOC-sized data, no progress bar."""
    image = TINY_IMAGE if args.tiny else VOC_IMAGE
    overrides: dict[str, Any] = {
        "runtime.device": device.type, "runtime.progress": "off", "runtime.output_dir": None,
        "model.weights": None,
        "data.options": {"image_size": list(image), "train_size": 32 if args.tiny else 64, "val_size": 2},
    }
    if args.tiny:
        overrides["data.num_workers"] = 0
    if args.crop:
        overrides["schedule.crop_size"] = args.crop
    if not (args.tiny and args.crop):  # paper scale: the chosen backbone, at any crop (data.num_workers: the preset's 4)
        overrides["model.backbone"] = args.backbone
    return overrides


def compose_cell(args: argparse.Namespace, device: torch.device, framework: str, head: str,
                 **more: Any) -> RunConfig:
    """The cell's configuration, its supervised-only / warm-up phases off (the semi-supervised step is measured)."""
    preset = "smoke" if args.tiny else "paper"
    overrides = {**cell_overrides(args, device), **more}
    config = cell_config(preset, framework=framework, dataset=DATASET, partition=PARTITION, head=head, **overrides)
    phases = {f"framework_options.{k}": 0 for k in ("sup_only_epochs", "warmup_epochs")
              if config.framework_options.get(k)}
    if phases:
        config = cell_config(preset, framework=framework, dataset=DATASET, partition=PARTITION, head=head,
                             **overrides, **phases)
    return config


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a cell's peak: CUDA's allocator statistics, or on CPU (Linux) the process's resident high-water mark.

    On CPU the freed heap is first handed back to the system (``malloc_trim``), so that the next cell's tensors
    cannot reuse pages the last one left resident without counting; the mark is then reset to the current resident
    size (``/proc/self/clear_refs``, Linux 4.0 and later)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory_mib(device: torch.device) -> float | None:
    """The cell's peak since ``reset_peak_memory``: ``max_memory_allocated`` on CUDA, peak RSS (VmHWM) on CPU.

    The CPU figure is the whole process's (libraries, the cached batches), as a CPU run's proxy for memory;
    None where ``/proc`` has no such line."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def measure_cell(args: argparse.Namespace, device: torch.device, framework: str, head: str,
                 batch_cache: dict[str, list[Any]] | None = None, **more: Any) -> dict[str, Any]:
    """Warm-up step + ``args.steps`` timed steps of one framework x head through ``setup_run`` / ``train_step``
    (``more``: overrides of the cell, e.g. a ViT backbone).

    The batches come from the run's data streams before timing; ``batch_cache`` keeps them for the next head of
    the same framework (the head changes no data setting), which saves most of the CPU time of the run."""
    config = compose_cell(args, device, framework, head, **more)
    started = time.perf_counter()
    reset_peak_memory(device)
    with backend_flags(config, device):
        run = setup_run(config, device)
        configure_np_decoders(run, args)
        key = json.dumps([config.data.model_dump(mode="json"), config.schedule.model_dump(mode="json"),
                          run.framework.uses_unlabeled, args.steps], sort_keys=True)
        batches = (batch_cache or {}).get(key) or list(itertools.islice(run.streams.epoch(0, 0), 1 + args.steps))
        if batch_cache is not None:
            batch_cache[key] = batches
        if len(batches) < 1 + args.steps:
            raise RuntimeError(f"{framework} x {head}: the data streams gave {len(batches)} batches")
        times, cpu_times, logs, first_step_s = [], [], {}, None
        for step, batch in enumerate(batches):
            synchronize(device)
            tick, cpu_tick = time.perf_counter(), time.process_time()
            logs = train_step(run.framework, batch, step_context(run, step), run.optimizer, config, device,
                              run.world_size)
            synchronize(device)
            if step:  # the first is the warm-up (cuDNN autotuning, allocator), reported on its own
                times.append(time.perf_counter() - tick)
                cpu_times.append(time.process_time() - cpu_tick)
            else:
                first_step_s = time.perf_counter() - tick
        peak = peak_memory_mib(device)
        profile = profile_step(run, batches[-1], len(batches), config, device, args.profile) if args.profile else None
        host = count_host_work(run, batches[-1], len(batches), config, device) if args.host_work else None
        flops = count_flops(run, batches[-1], len(batches), config, device) if args.flops else None
    schedule = config.schedule
    uses_unlabeled = run.framework.uses_unlabeled
    images = schedule.batch_size + (schedule.unlabeled_batch_size if uses_unlabeled else 0)
    step_s = statistics.median(times)
    del run
    return {
        "framework": framework, "head": head, "backbone": config.model.backbone, "crop": schedule.crop_size,
        "labeled_batch": schedule.batch_size, "unlabeled_batch": schedule.unlabeled_batch_size if uses_unlabeled else 0,
        "amp_bf16": device.type == "cuda" and config.runtime.amp, "step_s": step_s, "all_step_s": times,
        "step_cpu_s": statistics.median(cpu_times),
        "first_step_s": first_step_s, "first_step_ratio": first_step_s / step_s,
        "images_per_s": images / step_s, "peak_memory_mib": peak,
        "peak_memory_measure": "max_memory_allocated" if device.type == "cuda" else "peak RSS", "loss": logs.get("train/loss"),
        "pixels_per_step": schedule.crop_size ** 2 * images, "cell_s": time.perf_counter() - started,
        **({"np_feature_pool": config.head.options.get("feature_pool", 1)} if head == "np" else {}),
        **({"profile": profile} if profile is not None else {}),
        **({"host_work": host} if host is not None else {}),
        **({"flops": flops} if flops is not None else {}),
    }


def measure_compiled(args: argparse.Namespace, device: torch.device, eager: dict[str, Any],
                     batch_cache: dict[str, list[Any]], failed: Any) -> dict[str, Any]:
    """The cell of ``eager`` again with ``runtime.compile=args.compile`` on the same batches, with its eager /
    compiled ratios; dynamo's caches are emptied first, so its first step is the cell's compilation (inductor's
    on-disk cache may still serve kernels compiled before)."""
    framework, head = eager["framework"], eager["head"]
    torch._dynamo.reset()
    try:
        cell = measure_cell(args, device, framework, head, batch_cache, **{"runtime.compile": args.compile})
    except Exception as error:  # reported; the exit status says so
        cell = {"framework": framework, "head": head, **failed(f"{framework} x {head} compiled", error)}
        print(f"{framework:<11}{head:<12}compiled: error: {cell['error']}", flush=True)
        return cell
    cell["compile"] = args.compile
    cell["eager_over_compiled"] = eager["step_s"] / cell["step_s"]
    print(f"{'':<11}{'(compiled)':<12}{cell['step_s']:>9.4f}{cell['images_per_s']:>9.1f}{'':>10}{cell['cell_s']:>8.1f}"
          f"  first step {cell['first_step_s']:.1f} s, eager / compiled {cell['eager_over_compiled']:.2f}", flush=True)
    return cell


def compiled_markdown(report: dict[str, Any]) -> str:
    """The eager vs compiled table of ``--compile`` (empty without it)."""
    compiled = report.get("compiled_cells")
    if not compiled:
        return ""
    eager = {(c["framework"], c["head"]): c for c in report.get("cells", []) if "error" not in c}
    lines = ["", "## Compiled vs eager", "",
             "Same batches, same seed; first step = dynamo + inductor compilation (one warm-up step for eager). "
             "Operator calls and host reads: ``host_work.py``'s counts, under whose modes the compiled frames have run as "
             "eager so far (equal counts).", "",
             "| framework | head | mode | eager step s | compiled step s | eager / compiled | eager first step s "
             "| compiled first step s | operator calls eager / compiled | host reads eager / compiled |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in compiled:
        e = eager.get((c["framework"], c["head"]))
        if "error" in c or e is None:
            lines.append(f"| {c['framework']} | {c['head']} | error: {c.get('error', 'no eager cell')[:120]} "
                         "| | | | | | | |")
            continue
        eh, ch = e.get("host_work", {}), c.get("host_work", {})
        lines.append(f"| {c['framework']} | {c['head']} | {c['compile']} | {e['step_s']:.4f} | {c['step_s']:.4f} | "
                     f"{c['eager_over_compiled']:.2f} | {e['first_step_s']:.2f} | {c['first_step_s']:.2f} | "
                     f"{eh.get('ops', '-')} / {ch.get('ops', '-')} | {eh.get('reads', '-')} / {ch.get('reads', '-')} |")
    return "\n".join(lines) + "\n"


def configure_np_decoders(run: Any, args: argparse.Namespace) -> None:
    """``--np-samples-per-conv`` and ``--np-keep-first-stage`` on every NP decoder of the run's models."""
    if not (args.np_samples_per_conv or args.np_keep_first_stage):
        return  # the decoders' own defaults
    for model in run.framework.modules().values():
        for module in model.modules():
            if isinstance(module, NPDecoder):
                module.samples_per_conv = args.np_samples_per_conv or module.samples_per_conv
                module.keep_first_stage = args.np_keep_first_stage


def step_context(run: Any, step: int) -> StepContext:
    plan = run.plan
    return StepContext(step=step, total_steps=plan.total_steps, epoch=step // plan.iters_per_epoch,
                       total_epochs=plan.total_epochs, iters_per_epoch=plan.iters_per_epoch)


def count_host_work(run: Any, batch: Any, step: int, config: RunConfig, device: torch.device) -> dict[str, Any]:
    """One more step under ``host_work.HostWork``: its operator calls and host reads (untimed: counting slows it)."""
    with HostWork(device) as work:
        train_step(run.framework, batch, step_context(run, step), run.optimizer, config, device, run.world_size)
    synchronize(device)
    return work.summary()


def count_flops(run: Any, batch: Any, step: int, config: RunConfig, device: torch.device) -> dict[str, Any]:
    """One more step under ``torch.utils.flop_counter.FlopCounterMode``: the floating-point operations of its
    matrix products and convolutions, forward and backward, by operator (element-wise work is not counted). The
    NP / baseline ratio of these totals is the least step-time ratio a device bound by its arithmetic could reach.
    (The counter's split by module is left out: with custom autograd functions its backward shares are wrong.)"""
    counter = FlopCounterMode(display=False)
    with counter:
        train_step(run.framework, batch, step_context(run, step), run.optimizer, config, device, run.world_size)
    synchronize(device)
    by_operator = sorted(counter.get_flop_counts()["Global"].items(), key=lambda item: item[1], reverse=True)
    return {"gflop": counter.get_total_flops() / 1e9,
            "by_operator": [{"operator": str(op), "gflop": flops / 1e9} for op, flops in by_operator]}


def profile_step(run: Any, batch: Any, step: int, config: RunConfig, device: torch.device,
                 rows: int) -> list[dict[str, Any]]:
    """One more step under ``torch.profiler``: the ``rows`` operators of the most self time on the device
    (CUDA kernels on a GPU, CPU time on CPU), with their calls; where a head's extra time goes."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    ctx = step_context(run, step)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        train_step(run.framework, batch, ctx, run.optimizer, config, device, run.world_size)
        synchronize(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    events = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:rows]
    cpu_ms = sum(e.self_cpu_time_total for e in averages) / 1e3
    # on a GPU the kernels' own events carry the device time (the operators that launched them repeat it)
    kernels = [e for e in averages if e.device_type != DeviceType.CPU] if device.type == "cuda" else averages
    totals = {"op": f"(all operators; host self CPU {cpu_ms:.1f} ms)", "self_ms": sum(getattr(e, key) for e in kernels) / 1e3,
              "calls": sum(e.count for e in averages if e.key.startswith("aten::")), "cpu_ms": cpu_ms}
    return [totals] + [{"op": e.key, "self_ms": getattr(e, key) / 1e3, "calls": e.count} for e in events]


def ratios(cells: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per framework: step time and peak memory (FLOPs, host work where counted) of every other head over the baseline
    head's (``np``, ``mc_dropout``, ``np_pool<p>`` of ``--vit-np-pools``)."""
    by = {(c["framework"], c["head"]): c for c in cells}
    out: dict[str, dict[str, float | None]] = {}
    for framework in dict.fromkeys(c["framework"] for c in cells):
        base = by.get((framework, "baseline"))
        if base is None:
            continue
        row: dict[str, float | None] = {}
        for head in dict.fromkeys(c["head"] for c in cells if c["framework"] == framework and c["head"] != "baseline"):
            cell = by[framework, head]
            row[f"{head}_step_ratio"] = cell["step_s"] / base["step_s"]
            row[f"{head}_memory_ratio"] = (cell["peak_memory_mib"] / base["peak_memory_mib"]
                                           if cell["peak_memory_mib"] and base["peak_memory_mib"] else None)
            if "flops" in cell and "flops" in base:
                row[f"{head}_flops_ratio"] = cell["flops"]["gflop"] / base["flops"]["gflop"]
            if "host_work" in cell and "host_work" in base:
                row[f"{head}_ops_ratio"] = cell["host_work"]["ops"] / base["host_work"]["ops"]
                row[f"{head}_extra_reads"] = cell["host_work"]["reads"] - base["host_work"]["reads"]
        out[framework] = row
    return out


def ddp_and_inference(args: argparse.Namespace, device: torch.device) -> tuple[dict[str, Any], dict[str, Any]]:
    """A one-rank process group around the project's loop, then predict / evaluate / export / load on the device."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    framework, head = DDP_CELL
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = compose_cell(args, device, framework, head, **{
        "schedule.max_steps": args.ddp_steps, "schedule.eval_every_epochs": 0, "schedule.checkpoint_every_steps": 0,
        "evaluation.max_images": 2, "evaluation.figures": False})
    started = time.perf_counter()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            **({"device_id": device} if device.type == "cuda" else {}))
    try:
        result = train(config)
        assert result.framework is not None
        student = unwrap(result.framework.student)
        parameters = [p for p in student.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in parameters[:4]]
        broadcast_state([student])
        average_gradients(parameters, 1)
        probe = torch.ones(4, device=device)
        dist.all_reduce(probe)
        unchanged = all(torch.equal(b, p.detach()) for b, p in zip(before, parameters[:4]))
        ddp = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "cell": f"{framework} x {head}",
               "steps": result.steps, "train_seconds": result.train_seconds, "seconds": time.perf_counter() - started,
               "final_miou": result.metrics.get("miou"), "all_reduce_ok": bool(probe.eq(1).all().item()),
               "broadcast_unchanged": unchanged}
    finally:
        dist.destroy_process_group()
    inference = inference_checks(config, result, device)
    return ddp, inference


def inference_checks(config: RunConfig, result: Any, device: torch.device) -> dict[str, Any]:
    """``SegmentationModel.predict`` / ``evaluate`` / ``export`` + ``load_model`` of the trained model on the device."""
    model = SegmentationModel(config, result.framework.eval_model(), step=result.steps, mode="whole").to(device)
    info = dataset_info(config.dataset, **dict(config.data.options))
    rows, cols = info.options["image_size"] if isinstance(info.options["image_size"], Sequence) else (
        info.options["image_size"],) * 2
    images = torch.rand(2, 3, rows, cols, generator=torch.Generator().manual_seed(0))
    synchronize(device)
    tick = time.perf_counter()
    labels, uncertainty = model.predict(images)
    synchronize(device)
    predict_s = time.perf_counter() - tick
    tick = time.perf_counter()
    metrics = model.evaluate(max_images=2)
    synchronize(device)
    evaluate_s = time.perf_counter() - tick
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-") as tmp:
        path = model.export(Path(tmp) / "model.pt")
        loaded = load_model(path, device=device)
        again, _ = loaded.predict(images)
    return {
        "device": str(model.device), "predict_shape": list(labels.shape), "predict_s": predict_s,
        "predict_labels_in_range": bool(labels.min() >= 0 and labels.max() < config.num_classes),
        "uncertainty_finite": bool(torch.isfinite(uncertainty).all()), "evaluate_s": evaluate_s,
        "evaluate_miou": metrics.get("miou"), "evaluate_metrics": len(metrics),
        "export_roundtrip_equal": bool(torch.equal(labels.cpu(), again.cpu())),
    }


def gpu_hours(spec_path: Path, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """GPU-hours of the spec's cells from the measured step times, scaled by pixels per step."""
    from semiseg_platform.sweeps.grid_spec import expand, load_spec

    spec = load_spec(spec_path)
    workers = spec.resources.workers
    gpus = workers * max(1.0, spec.resources.gpus_per_worker)
    measured = {(c["framework"], c["head"]): c for c in cells}
    by_backbone = {(c["framework"], c["head"], c["backbone"]): c for c in cells}
    measured_backbones = {c["backbone"] for c in cells}
    rows, total, total_steps, backbones, unmeasured, fp32_cells = [], 0.0, 0, set(), 0, 0
    by_dataset: dict[str, float] = {}
    for config in expand(spec):
        info = config.dataset_info
        try:
            labeled = len(partition_ids(config.dataset, "labeled", config.partition, partition_lists=config.partition_lists))
            unlabeled = len(partition_ids(config.dataset, "unlabeled", config.partition,
                                          partition_lists=config.partition_lists))
        except (FileNotFoundError, ValueError):
            labeled = info.partitions[config.partition]
            unlabeled = info.train_size - labeled
        plan = plan_run(config, num_labeled=labeled, num_unlabeled=unlabeled, world_size=workers)
        head = config.head.name
        pool = config.head.options.get("feature_pool")
        if head == "np" and isinstance(pool, int) and (config.framework, f"np_pool{pool}") in measured:
            head = f"np_pool{pool}"  # the NP head at the cell's own feature_pool (released: 1), --vit-np-pools
        cell = by_backbone.get((config.framework, head, config.model.backbone)) or measured.get((config.framework, head))
        if cell is None:
            unmeasured += 1
            continue
        schedule = config.schedule
        images = schedule.batch_size + (schedule.unlabeled_batch_size if get_framework(config.framework).uses_unlabeled
                                        else 0)
        step_s = cell["step_s"] * (schedule.crop_size ** 2 * images) / cell["pixels_per_step"]
        hours = plan.total_steps * step_s * gpus / 3600
        total += hours
        total_steps += plan.total_steps
        rows.append({"cell": config.cell_name, "steps": plan.total_steps, "step_s": step_s, "gpu_hours": hours})
        by_dataset[config.dataset] = by_dataset.get(config.dataset, 0.0) + hours
        backbones.add(config.model.backbone)
        fp32_cells += not config.runtime.amp
    return {
        "spec": str(spec_path.relative_to(ROOT) if spec_path.is_relative_to(ROOT) else spec_path),
        "cells": len(rows), "unmeasured_cells": unmeasured, "gpus_per_cell": gpus, "total_steps": total_steps, "gpu_hours": total,
        "gpu_hours_by_dataset": by_dataset, "cells_detail": rows,
        "assumptions": [
            "each GPU of a cell's DDP workers takes the measured one-GPU step time (no gradient all-reduce cost)",
            "a cell's step time is its framework x head's measured one scaled linearly by pixels per step "
            "(crop^2 x labeled + unlabeled images per GPU): Cityscapes 2 + 2 at 580 and per-head publication "
            "settings from VOC's 3 + 3 at 480",
            "every step costs a semi-supervised step (supervised-only and warm-up epochs are not cheaper here)",
            "evaluation, checkpoints, data loading stalls and start-up are not counted",
            "the np_mean variant (attention=mean) costs the NP head's step",
            f"step times measured with backbone {', '.join(sorted(measured_backbones))}; the spec's cells use "
            f"{', '.join(sorted(backbones))} (a cell takes its own backbone's step where measured, else its framework "
            "x head's; a heavier measured backbone makes the estimate an upper bound)",
            *(["a ViT's attention grows with the square of the tokens: linear pixel scaling underestimates crops "
               "larger than the measured one (Cityscapes' 798 from 518)"] if any(is_vit_backbone(b) for b in backbones)
              else []),
            *([f"{fp32_cells} cells run in float32 (runtime.amp false: switch fp32 under released) but were timed with "
               "bf16 autocast: expect them slower"] if fp32_cells and any(c.get("amp_bf16") for c in cells) else []),
        ],
    }


def markdown(report: dict[str, Any]) -> str:
    lines = ["# GPU acceptance", "", f"- date: {report['date']}", f"- machine: {report['machine']}",
             f"- command: `{report['command']}`", f"- mode: {report['mode']}",
             f"- seconds so far: {report.get('seconds', 0.0):.1f}", f"- errors: {len(report['errors'])}",
             "", "## Steps", "",
             "Peak MiB: `torch.cuda.max_memory_allocated` on CUDA, the process's peak RSS on CPU; step CPU s: "
             "the process's CPU seconds per timed step (median).", "",
             "| framework | head | step s | step CPU s | first step s | images/s | peak MiB | GFLOP | operator calls "
             "| host reads |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in report.get("cells", []):
        if "error" in c:
            lines.append(f"| {c['framework']} | {c['head']} | error: {c['error'][:120]} | | | | | | | |")
            continue
        peak = f"{c['peak_memory_mib']:.0f}" if c["peak_memory_mib"] is not None else "-"
        host = c.get("host_work", {})
        lines.append(f"| {c['framework']} | {c['head']} | {c['step_s']:.4f} | {c['step_cpu_s']:.2f} | "
                     f"{c['first_step_s']:.4f} | "
                     f"{c['images_per_s']:.1f} | {peak} | {_f(c.get('flops', {}).get('gflop'))} | "
                     f"{host.get('ops', '-')} | {host.get('reads', '-')} |")
    lines += ["", "## Ratios to the baseline head", "",
              "| framework | NP step | MC step | NP memory | MC memory | NP FLOPs | NP operator calls "
              "| NP extra host reads |",
              "|---|---|---|---|---|---|---|---|"]
    for framework, r in report.get("ratios", {}).items():
        lines.append(f"| {framework} | {_f(r.get('np_step_ratio'))} | {_f(r.get('mc_dropout_step_ratio'))} | "
                     f"{_f(r.get('np_memory_ratio'))} | {_f(r.get('mc_dropout_memory_ratio'))} | "
                     f"{_f(r.get('np_flops_ratio'))} | {_f(r.get('np_ops_ratio'))} | {r.get('np_extra_reads', '-')} |")
    read_sites = [c for c in report.get("cells", []) if c.get("host_work", {}).get("read_sites")]
    if read_sites:
        lines += ["", "## Host reads (where a step waits for the device)"]
        for c in read_sites:
            lines += ["", f"### {c['framework']} x {c['head']}", "", "| calls | read at |", "|---|---|",
                      *[f"| {e['calls']} | `{e['site']}` |" for e in c["host_work"]["read_sites"]]]
    counted = [c for c in report.get("cells", []) if c.get("flops")]
    if counted:
        lines += ["", "## FLOPs by operator (one step, forward and backward)"]
        for c in counted:
            lines += ["", f"### {c['framework']} x {c['head']}", "", "| operator | GFLOP |", "|---|---|",
                      *[f"| `{e['operator']}` | {e['gflop']:.1f} |" for e in c["flops"]["by_operator"]]]
    profiled = [c for c in report.get("cells", []) if c.get("profile")]
    if profiled:
        lines += ["", "## Profiles (one step, costliest operators by self time on the device)", "",
                  "The first row sums every operator: self time on the device, the aten operators called "
                  "(calls) and the host's self CPU time."]
        for c in profiled:
            lines += ["", f"### {c['framework']} x {c['head']}", "", "| operator | self ms | calls |", "|---|---|---|",
                      *[f"| `{e['op']}` | {e['self_ms']:.2f} | {e['calls']} |" for e in c["profile"]]]
    for title, key in (("DDP (one rank)", "ddp"), ("Inference", "inference")):
        if key in report:
            lines += ["", f"## {title}", "", "```", json.dumps(report[key], indent=1), "```"]
    lines += hours_lines(report.get("gpu_hours"), "GPU-hours estimate")
    return "\n".join(lines) + "\n"


def hours_lines(est: dict[str, Any] | None, title: str) -> list[str]:
    """The Markdown of one GPU-hours estimate (:func:`gpu_hours`), or of its error; none where it was not made."""
    if not est:
        return []
    if "error" in est:
        return ["", f"## {title}", "", f"error: {est['error']}"]
    by_dataset = ", ".join(f"{k} {v:.1f}" for k, v in est["gpu_hours_by_dataset"].items())
    return ["", f"## {title}", "",
            f"{est['spec']}: {est['cells']} cells x {est['gpus_per_cell']:g} GPUs, {est['total_steps']} steps, "
            f"**{est['gpu_hours']:.1f} GPU-hours** ({by_dataset}); cells without a measured step: "
            f"{est['unmeasured_cells']}", "", *[f"- {a}" for a in est["assumptions"]]]


def vit_markdown(report: dict[str, Any]) -> str:
    """The ``--vit`` part: UniMatch V2's step per ViT x head, its NP / baseline ratios and the V2 spec's GPU-hours."""
    if "vit_cells" not in report:
        return ""
    lines = ["", f"## {VIT_FRAMEWORK} on DINOv2 (random init)", "",
             "| backbone | head | crop | images per GPU | step s | first step s | images/s | peak MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for c in report["vit_cells"]:
        if "error" in c:
            lines.append(f"| {c['backbone']} | {c['head']} | error: {c['error'][:120]} | | | | | |")
            continue
        lines.append(f"| {c['backbone']} | {c['head']} | {c['crop']} | {c['labeled_batch']} + {c['unlabeled_batch']} | "
                     f"{c['step_s']:.4f} | {c['first_step_s']:.4f} | {c['images_per_s']:.1f} | "
                     f"{_f(c['peak_memory_mib'])} |")
    lines += ["", "| backbone | head | step / baseline | memory / baseline | FLOPs / baseline |", "|---|---|---|---|---|"]
    for label, r in report.get("vit_ratios", {}).items():
        for head in dict.fromkeys(key.removesuffix("_step_ratio") for key in r if key.endswith("_step_ratio")):
            lines.append(f"| {label} | {head} | {_f(r.get(f'{head}_step_ratio'))} | {_f(r.get(f'{head}_memory_ratio'))} | "
                         f"{_f(r.get(f'{head}_flops_ratio'))} |")
    lines += hours_lines(report.get("vit_gpu_hours"), f"GPU-hours estimate of {VIT_FRAMEWORK}'s spec")
    return "\n".join(lines) + "\n"


def vit_cell_overrides(args: argparse.Namespace, vit: str) -> dict[str, Any]:
    """A ``--vit`` cell's backbone and crop: ``vit`` at the preset's 518 (random init: ``model.weights`` is None for
    every measured cell), or in tiny mode the tiny ViT at 28 px."""
    return dict(TINY_VIT) if args.tiny else {"model.backbone": vit, "schedule.crop_size": VIT_CROP}


def vit_steps(args: argparse.Namespace, device: torch.device, report: dict[str, Any], failed: Any,
              write: Any) -> list[dict[str, Any]]:
    """``--vit``: the cells (``report["vit_cells"]``) and their ratios per backbone (``vit_ratios``); the measured."""
    report["vit_cells"] = measure_vits(args, device, failed, write)
    measured = [c for c in report["vit_cells"] if "error" not in c]
    report["vit_ratios"] = ratios([{**c, "framework": f"{VIT_FRAMEWORK} {c['backbone']}"} for c in measured])
    return measured


def measure_vits(args: argparse.Namespace, device: torch.device, failed: Any, write: Any) -> list[dict[str, Any]]:
    """UniMatch V2's step per head on each ``--vit`` backbone (in tiny mode each is ``vit_tiny``, measured once); with
    ``--vit-np-pools`` the NP head again at each of those ``feature_pool`` values (head ``np_pool<p>``; ``np`` is the
    protocol's: ``corrected``, the DPT's 1/7 map)."""
    cells: list[dict[str, Any]] = []
    for vit in dict.fromkeys(TINY_VIT["model.backbone"] if args.tiny else v for v in args.vit):
        batch_cache: dict[str, list[Any]] = {}
        extra = [(f"np_pool{pool}", {"head.options.feature_pool": pool}) for pool in args.vit_np_pools]
        for head, more in [(head, {}) for head in args.heads] + (extra if "np" in args.heads else []):
            try:
                cell = measure_cell(args, device, VIT_FRAMEWORK, head.split("_pool")[0], batch_cache,
                                    **vit_cell_overrides(args, vit), **more)
                cell["head"] = head
            except Exception as error:  # reported; the exit status says so
                cell = {"framework": VIT_FRAMEWORK, "head": head, "backbone": vit,
                        **failed(f"{VIT_FRAMEWORK} x {head} on {vit}", error)}
            cells.append(cell)
            status = cell.get("error") or (f"{cell['step_s']:.4f} s/step, {cell['images_per_s']:.1f} img/s, peak "
                                           f"{_f(cell['peak_memory_mib'])} MiB")
            print(f"{VIT_FRAMEWORK} {vit:<10}{head:<12}{status}", flush=True)
            write()
    return cells


def _f(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--steps`` defaulted: 3, tiny 1); an error for ``--device cuda`` without CUDA."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="the smoke preset's model at 32 px crops (CPU checks)")
    parser.add_argument("--backbone", default="resnet101", help="backbone of the paper-scale cells (random init)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per cell (default 3; tiny 1)")
    parser.add_argument("--ddp-steps", type=int, default=2)
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--vit", nargs="+", default=[], choices=vit_backbone_names(), metavar="BACKBONE",
                        help=f"also a {VIT_FRAMEWORK} step per head on each ViT (random init, crop {VIT_CROP}), e.g. "
                             "dinov2_s dinov2_b, and the GPU-hours of --vit-spec (--tiny: vit_tiny)")
    parser.add_argument("--vit-np-pools", nargs="+", type=int, default=[], metavar="P",
                        help="--vit: the NP head also at these feature_pool values (1: on the DPT's map as it is)")
    parser.add_argument("--vit-spec", type=Path, default=DEFAULT_VIT_SPEC)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--frameworks", nargs="*", default=list(framework_names()))
    parser.add_argument("--heads", nargs="+", default=list(head_names()))
    parser.add_argument("--profile", type=int, default=0, metavar="ROWS",
                        help="profile one more step per cell and keep its ROWS costliest operators (default off)")
    parser.add_argument("--host-work", action="store_true",
                        help="count one more step's operator calls and host reads per cell (host_work.py)")
    parser.add_argument("--flops", action="store_true",
                        help="count one more step's matrix-product and convolution FLOPs per cell (the compute floor "
                             "of the step-time ratios)")
    parser.add_argument("--crop", type=int, default=None, help="crop size instead of the preset's (host counts on CPU)")
    parser.add_argument("--steps-only", action="store_true", help="only the steps: no DDP, inference or GPU-hours")
    parser.add_argument("--np-keep-first-stage", action="store_true",
                        help="the NP decoder keeps its first stage's maps for backward instead of recomputing them "
                             "(fewer operator calls, more memory: measure the trade)")
    parser.add_argument("--compile", default=None, choices=list(COMPILE_MODES), metavar="MODE",
                        help="also measure every cell with runtime.compile=MODE (one of "
                             f"{', '.join(COMPILE_MODES)}; first step = compilation, reported apart)")
    parser.add_argument("--np-samples-per-conv", type=int, default=None, metavar="N",
                        help="the NP decoder's samples per convolution call (default: the device's; e.g. 5 = "
                             "the CUDA path's calls counted on CPU)")
    args = parser.parse_args(argv)
    args.steps = args.steps if args.steps is not None else (1 if args.tiny else 3)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available (use --device cpu --tiny for the CPU check)")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_arguments(argv)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    started = time.perf_counter()
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine(device),
        "command": shlex.join(["python", "benchmarks/gpu_acceptance.py", *(argv if argv is not None else sys.argv[1:])]),
        "mode": ("tiny (smoke preset model, not paper scale)" if args.tiny else f"paper preset, {args.backbone}")
        + (f", crop {args.crop}" if args.crop else "")
        + (f", NP samples per conv {args.np_samples_per_conv}" if args.np_samples_per_conv else "")
        + (", NP first stage kept" if args.np_keep_first_stage else ""),
        "torch": torch.__version__, "device": str(device),
    }
    report["errors"] = []

    def failed(part: str, error: BaseException) -> dict[str, str]:
        """Record a part's error and go on: one failing cell must not cost the rest of a GPU session."""
        traceback.print_exception(error)
        message = f"{type(error).__name__}: {error}"
        report["errors"].append(f"{part}: {message}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": message}

    def write() -> None:
        report["seconds"] = time.perf_counter() - started
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_acceptance.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "gpu_acceptance.md").write_text(markdown(report) + compiled_markdown(report) + vit_markdown(report))

    cells: list[dict[str, Any]] = []
    report["cells"] = cells
    batch_cache: dict[str, list[Any]] = {}
    print(f"{'framework':<11}{'head':<12}{'step s':>9}{'img/s':>9}{'peak MiB':>10}{'cell s':>8}", flush=True)
    for framework in args.frameworks:
        batch_cache.clear()
        for head in args.heads:
            try:
                cell = measure_cell(args, device, framework, head, batch_cache)
            except Exception as error:  # reported; the exit status says so
                cells.append({"framework": framework, "head": head, **failed(f"{framework} x {head}", error)})
                print(f"{framework:<11}{head:<12}error: {cells[-1]['error']}", flush=True)
                continue
            cells.append(cell)
            peak = f"{cell['peak_memory_mib']:.0f}" if cell["peak_memory_mib"] is not None else "-"
            print(f"{framework:<11}{head:<12}{cell['step_s']:>9.4f}{cell['images_per_s']:>9.1f}{peak:>10}"
                  f"{cell['cell_s']:>8.1f}", flush=True)
            if args.compile:
                report.setdefault("compiled_cells", []).append(measure_compiled(args, device, cell, batch_cache, failed))
            write()
    measured = [c for c in cells if "error" not in c]
    report["ratios"] = ratios(measured)
    vit_measured = vit_steps(args, device, report, failed, write) if args.vit else []
    for framework, r in {**report["ratios"], **report.get("vit_ratios", {})}.items():
        print(f"{framework:<11}NP/baseline {_f(r.get('np_step_ratio'))}  MC/baseline {_f(r.get('mc_dropout_step_ratio'))}"
              f"  (memory {_f(r.get('np_memory_ratio'))} / {_f(r.get('mc_dropout_memory_ratio'))})", flush=True)
    write()
    if args.steps_only:
        print(f"wrote {args.out / 'gpu_acceptance.json'} (steps only)", flush=True)
        return report
    try:
        report["ddp"], report["inference"] = ddp_and_inference(args, device)
        print(f"DDP: {report['ddp']['backend']} world {report['ddp']['world_size']}, {report['ddp']['steps']} steps, "
              f"all-reduce ok {report['ddp']['all_reduce_ok']}", flush=True)
        print(f"inference on {report['inference']['device']}: predict {report['inference']['predict_s']:.3f} s, "
              f"evaluate miou {report['inference']['evaluate_miou']}, export round trip "
              f"{report['inference']['export_roundtrip_equal']}", flush=True)
    except Exception as error:
        report.setdefault("ddp", failed("ddp / inference", error))
        report.setdefault("inference", {"error": report["ddp"].get("error", "not run")})
    write()
    try:
        report["gpu_hours"] = gpu_hours(args.spec.resolve(), measured)
        print(f"GPU-hours of {report['gpu_hours']['spec']}: {report['gpu_hours']['gpu_hours']:.1f} "
              f"({report['gpu_hours']['cells']} cells, {report['gpu_hours']['unmeasured_cells']} without a measured "
              "step)" + (" [tiny mode: not an estimate]" if args.tiny else ""), flush=True)
    except Exception as error:
        report["gpu_hours"] = failed("gpu_hours", error)
    if args.vit:
        try:
            report["vit_gpu_hours"] = gpu_hours(args.vit_spec.resolve(), vit_measured)
            print(f"GPU-hours of {report['vit_gpu_hours']['spec']}: {report['vit_gpu_hours']['gpu_hours']:.1f}"
                  + (" [tiny mode: not an estimate]" if args.tiny else ""), flush=True)
        except Exception as error:
            report["vit_gpu_hours"] = failed("vit_gpu_hours", error)
    write()
    print(f"wrote {args.out / 'gpu_acceptance.json'} and gpu_acceptance.md ({report['seconds']:.1f} s, "
          f"{len(report['errors'])} errors)", flush=True)
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)

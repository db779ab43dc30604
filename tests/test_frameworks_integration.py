"""SSL frameworks inside the training loop: exact resume of U2PL with the NP head, and a
two-process gloo run whose ranks keep identical weights, NP memories and U2PL queues."""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from npsemiseg.callbacks import Callbacks

#: U2PL from the first step, small queues (the paper's sizes are defaults for the paper preset)
U2PL_OPTIONS = {"sup_only_epochs": 0, "num_queries": 8, "num_negatives": 4, "queue_size": 32,
                "background_queue_size": 48}


def _state(directory: Path) -> dict:
    return torch.load(Path(directory) / "state.pt", map_location="cpu", weights_only=False)


def _assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    else:
        assert a == b, where


@pytest.mark.integration  # three short training runs on the smoke model: a few seconds
@pytest.mark.parametrize("framework", ["u2pl", "augseg"])
def test_resume_is_exact_for_ssl_with_np(smoke_config, tmp_path, framework):
    """4 straight steps == 2 steps + checkpoint + restore + 2 steps: weights, teacher, NP memories,
    U2PL queues, losses and final metrics, bit for bit on CPU."""
    from npsemiseg.training import train

    options = U2PL_OPTIONS if framework == "u2pl" else {}
    base = dict(framework_options=options, **{"schedule.max_steps": 4, "runtime.device": "cpu"})
    record_a, record_b = _Record(), _Record()
    straight = train(smoke_config(framework=framework, head="np", **base, **{"runtime.output_dir": str(tmp_path / "a")}),
                     record_a)
    resumed_dir = str(tmp_path / "b")
    first = train(smoke_config(framework=framework, head="np", **base,
                               **{"runtime.output_dir": resumed_dir, "runtime.stop_at_step": 2}), record_b)
    assert first.steps == 2 and first.checkpoint is not None
    second = train(smoke_config(framework=framework, head="np", **base, **{"runtime.output_dir": resumed_dir}),
                   record_b, resume_from=first.checkpoint)
    assert second.steps == straight.steps == 4
    a, b = _state(straight.checkpoint), _state(second.checkpoint)
    _assert_same(a["modules"], b["modules"], "modules")
    _assert_same(a["framework"], b["framework"], "framework")
    assert a["modules"]["student"]["head.target_count"].sum() > 0
    if framework == "u2pl":
        assert any(v.numel() > 0 for k, v in a["framework"]["queues"].items() if k.startswith("keys."))
    assert _untimed(straight.metrics) == _untimed(second.metrics)
    untimed_a = {step: _untimed(logs) for step, logs in record_a.steps.items()}
    assert untimed_a == {step: _untimed(logs) for step, logs in record_b.steps.items()}
    assert set(record_a.steps) == {1, 2, 3, 4}


class _Record(Callbacks):
    """Keeps every step's loss terms (timings left out)."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}

    def on_step(self, step, total_steps, logs) -> None:
        self.steps[step] = {k: v for k, v in logs.items() if "sec" not in k}


def _untimed(metrics: dict[str, float]) -> dict[str, float]:
    """Without what measures the machine rather than the run (times, throughput, peak memory)."""
    return {k: v for k, v in metrics.items()
            if "second" not in k and k not in ("train/epoch_images_per_sec", "train/peak_memory_mb")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world_size: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        import npsemiseg.training as training
        import npsemiseg.training.setup as setup
        from npsemiseg.config import cell_config

        built = {}
        build = setup.build_framework

        def keep(config, *args, **kwargs):  # the loop's own builder; keeps the framework to inspect
            built["framework"] = build(config, *args, **kwargs)
            return built["framework"]

        setup.build_framework = keep
        config = cell_config("smoke", framework="u2pl", head="np", framework_options=U2PL_OPTIONS,
                                       **{"schedule.max_steps": 3, "runtime.device": "cpu"})
        training.train(config)
        fw = built["framework"]
        buffer = io.BytesIO()  # bytes, not shared-memory tensors: the process ends before the parent reads
        torch.save(({name: m.state_dict() for name, m in fw.modules().items()}, fw.state_dict()), buffer)
        queue.put((rank, buffer.getvalue()))
    finally:
        dist.destroy_process_group()


@pytest.mark.integration  # two spawned processes importing torch: ~15 s on the shared CPU
def test_two_gloo_ranks_keep_np_memories_weights_and_queues_identical():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(rank, 2, port, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=300) for _ in procs), key=lambda r: r[0])
    (modules_0, extra_0), (modules_1, extra_1) = (torch.load(io.BytesIO(data), weights_only=False) for _, data in results)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    _assert_same(modules_0, modules_1, "modules")
    _assert_same(extra_0, extra_1, "framework")
    student = modules_0["student"]
    assert student["head.target_count"].sum() > 0 and student["head.context_count"].sum() > 0
    assert any(v.numel() > 0 for k, v in extra_0["queues"].items() if k.startswith("keys."))

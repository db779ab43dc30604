"""Two gloo ranks on CPU: weights, buffers and NP memories stay identical across ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FRAMEWORKS = ("supervised", "u2pl")


def _train_on_rank(rank: int, world_size: int, directory: str) -> None:
    """Train each framework as one rank of a gloo group; save every module as this rank holds it."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{directory}/store", rank=rank, world_size=world_size)
    try:
        from npsemiseg.config import cell_config
        from npsemiseg.training import build_framework, train

        for framework in FRAMEWORKS:
            config = cell_config("smoke", framework=framework, dataset="synthetic", partition="1/16",
                                           head="np")
            initial = build_framework(config).student.state_dict()
            result = train(config)
            torch.save({"modules": {n: m.state_dict() for n, m in result.framework.modules().items()},
                        "initial": initial, "metrics": result.metrics, "steps": result.steps},
                       f"{directory}/{framework}-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_two_gloo_ranks_stay_identical(tmp_path: Path):
    mp.spawn(_train_on_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    for framework in FRAMEWORKS:
        states = [torch.load(tmp_path / f"{framework}-rank{r}.pt", weights_only=False) for r in range(2)]
        modules0, modules1 = states[0]["modules"], states[1]["modules"]
        assert modules0.keys() == modules1.keys() and states[0]["steps"] == 3
        for name in modules0:
            for key, value in modules0[name].items():
                assert torch.equal(value, modules1[name][key]), f"{framework}: {name}.{key} differs across ranks"
        student = modules0["student"]
        memories = [k for k in student if "memory" in k]
        assert memories and any(student[k].float().abs().sum() > 0 for k in memories)
        changed = [k for k, v in states[0]["initial"].items()
                   if v.is_floating_point() and not torch.equal(v, student[k])]
        assert changed, f"{framework}: training changed no weight"
        # evaluation is sharded over the ranks and summed: both ranks report the same numbers
        timing = {"seconds_per_image"}
        assert {k: v for k, v in states[0]["metrics"].items() if k not in timing} == pytest.approx(
            {k: v for k, v in states[1]["metrics"].items() if k not in timing}, nan_ok=True)

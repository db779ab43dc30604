"""The tools of `benchmarks/` behind the host-work and step-memory figures: operator calls, host reads, peak tensor memory."""

from __future__ import annotations

import torch
from benchmark_scripts import load_benchmark


def test_counts_operator_calls_and_every_kind_of_read_with_its_site():
    host_work = load_benchmark("host_work")
    x = torch.arange(6.0)
    with host_work.HostWork() as work:
        total = (x * 2).sum()  # mul, sum: no read
        float(total), total.item(), bool(total > 0), x.tolist()
        x[x > 2], x.nonzero()  # sizes that depend on the values
    assert work.ops >= 8 and work.reads == 6
    assert sum(work.read_sites.values()) == 6 and all("test_host_work" not in s for s in work.read_sites)
    assert work.summary()["reads"] == 6 and work.summary()["read_sites"]


def test_on_a_gpu_only_reads_of_device_tensors_count():
    """A value drawn on the host (a CPU generator's draw) waits for no device: not counted when measuring a GPU."""
    host_work = load_benchmark("host_work")
    drawn = torch.rand((), generator=torch.Generator().manual_seed(0))
    with host_work.HostWork("cuda") as work:
        float(drawn), bool(drawn > 0.5)
    assert work.reads == 0 and work.ops >= 1


def test_step_memory_peak_is_the_largest_sum_of_live_tensors_the_step_made():
    """``benchmarks/step_memory.py``: 4 MiB made and freed, then 1 + 2 MiB held together: the peak is 4 MiB, not 7;
    tensors that existed before the step do not count."""
    step_memory = load_benchmark("step_memory")
    before = torch.ones(1 << 20)  # 4 MiB, made before the step

    def step():
        first = torch.ones(1 << 20)
        del first
        held = [torch.ones(1 << 18), torch.ones(1 << 19)]
        before.add_(1.0)
        return held

    peak = step_memory.step_peak_mib(step)
    assert 4.0 <= peak < 4.1

"""The host-work counter (``benchmarks/host_work.py``) tells host draws from device reads on a CPU run."""

import torch

from benchmark_scripts import load_benchmark


def _count(body) -> tuple[int, int]:
    with load_benchmark("host_work").HostWork() as work:
        body()
    return work.reads, work.host_reads


def test_a_draw_made_on_the_host_and_read_back_is_a_host_read():
    """A factory without ``device`` makes a host tensor; arithmetic on host tensors stays on the host; a dtype cast
    keeps it there. None of these waits for a GPU in a CUDA run."""
    assert _count(lambda: float(torch.rand(()))) == (0, 1)
    assert _count(lambda: (torch.randint(0, 9, (4,)) * 2 - 1).clamp(0, 5).to(torch.float64).tolist()) == (0, 1)
    assert _count(lambda: int(torch.randperm(5)[0])) == (0, 1)


def test_a_value_on_the_step_device_is_a_device_read():
    """An explicit ``device=``, a move with ``.to(device)`` or ``.to(tensor)``, and any operator mixing a host tensor with
    a device tensor make device values: reading them is a synchronisation on CUDA."""
    x = torch.ones(3)  # made outside the counter, as the step's batches are
    assert _count(lambda: torch.rand((), device=x.device).item()) == (1, 0)
    assert _count(lambda: torch.rand(3).to(x.device)[0].item()) == (1, 0)
    assert _count(lambda: torch.rand(3).to(x).sum().item()) == (1, 0)
    assert _count(lambda: (torch.rand(3) + x).sum().item()) == (1, 0)
    assert _count(lambda: x.sum().item()) == (1, 0)
    assert _count(lambda: torch.rand_like(x).sum().item()) == (1, 0)

"""What a training step asks of the host: operator calls and reads of device values back to the host.

At a small batch a GPU step is bound by the host (``docs/performance.md``, "GPU acceptance"): each operator call
costs the host some microseconds of Python and dispatch before its kernel is queued, and each read of a value
(``.item()``, ``.tolist()``, ``bool(t)``, an operator whose output size depends on the data) waits until the device
has finished everything queued before it. Both counts are the same on CPU and CUDA for the same code path, so they
are measured on CPU where no GPU is lent. Used by ``gpu_acceptance.py --host-work``.

``HostWork`` counts, while active:

- ``ops``: aten operator calls that reach the dispatcher (``TorchDispatchMode``), views included, as the
  profiler's ``aten::`` call count;
- ``reads``: host reads of device values (``TorchFunctionMode``: ``item``, ``tolist``, ``bool`` / ``int`` /
  ``float`` / index / format of a tensor) and operators whose output size depends on the values
  (``nonzero``, ``masked_select``, ``unique``, boolean-mask indexing), each one synchronisation on CUDA;
- ``read_sites``: where in the project's code each read happened (``file:line function``).

On a GPU (``HostWork(device)`` with a CUDA device) only reads of tensors on the GPU count: a value drawn on the host
(a CutMix box or a Beta draw from a CPU generator) waits for nothing. On CPU every tensor is on the host, so the
counter tells the two apart by where the tensor would live in a CUDA run: a tensor made by a factory function
(``torch.rand``, ``randint``, ``arange``, ``tensor``, ...) without a ``device`` argument is a *host tensor*, and so is
every operator's output whose tensor inputs are all host tensors; ``.to(...)`` / ``.cuda()`` with a device (or
another tensor) makes a device tensor, ``.to(dtype)`` keeps where it was. Reads of host tensors are counted apart
(``host_reads``, ``host_read_sites``): they are the reads a CUDA run does not wait for. The rule is conservative:
a tensor made with an explicit ``device=`` (even ``cpu``) and everything the batches touch count as device values.
"""

from __future__ import annotations

import collections
import traceback
import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: tensor methods that hand a device value to Python
READ_METHODS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__format__"})
#: operators whose output shape depends on the input's values (the host waits for them on CUDA)
DATA_DEPENDENT_OPS = frozenset({"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive"})
PROJECT_DIRS = ("/npsemiseg/", "/semiseg_platform/")
#: functions that make a new tensor; without a ``device`` argument it lives on the host in any run
FACTORIES = frozenset({"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
                       "bernoulli", "multinomial", "arange", "linspace", "full", "zeros", "ones", "empty", "tensor",
                       "as_tensor", "from_numpy", "eye"})
#: methods that move a tensor to a device (``to`` only when given a device or a tensor)
MOVES = frozenset({"to", "cuda", "pin_memory"})


def _project_site() -> str:
    for frame in reversed(traceback.extract_stack(limit=40)):
        for folder in PROJECT_DIRS:
            if folder in frame.filename:
                return f"{folder.strip('/')}/{frame.filename.split(folder, 1)[1]}:{frame.lineno} {frame.name}"
    return "(outside the project)"


class _CountOps(TorchDispatchMode):
    def __init__(self, work: HostWork) -> None:
        super().__init__()
        self.work = work

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.work.ops += 1
        name = func.overloadpacket.__name__
        if name in DATA_DEPENDENT_OPS or (name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()))):
            self.work.read(name, args[0])
        return func(*args, **(kwargs or {}))


class _CountReads(TorchFunctionMode):
    def __init__(self, work: HostWork) -> None:
        super().__init__()
        self.work = work

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        kwargs = kwargs or {}
        if name in READ_METHODS and args and isinstance(args[0], torch.Tensor):
            self.work.read(name, args[0])
        out = func(*args, **kwargs)
        if not self.work.on_gpu:
            if self._on_host(name, args, kwargs):
                self.work.mark_host(out)
            elif name in MOVES:  # on CPU ``.to(device)`` may return the tensor itself: from here on a device value
                self.work.unmark(out)
        return out

    def _on_host(self, name: str, args: tuple, kwargs: dict) -> bool:
        """Whether ``name(*args, **kwargs)`` would return a host tensor in a CUDA run (module docstring)."""
        if name in FACTORIES and "device" not in kwargs and not any(isinstance(a, torch.device) for a in args):
            return not (name.endswith("_like") and not self.work.is_host(args[0]))
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if name in MOVES:
            moved = name != "to" or "device" in kwargs or any(
                isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:])
            return not moved and bool(tensors) and self.work.is_host(tensors[0])
        return bool(tensors) and all(self.work.is_host(t) for t in tensors)


class HostWork:
    """Context manager counting operator calls and host reads (module docstring) of the code it wraps."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.on_gpu = device is not None and torch.device(device).type != "cpu"
        self.ops = 0
        self.reads = 0
        self.read_sites: collections.Counter[str] = collections.Counter()
        self.host_reads = 0
        self.host_read_sites: collections.Counter[str] = collections.Counter()
        self._host: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._modes: list[Any] = []

    def mark_host(self, out: Any) -> None:
        """Remember the tensors of ``out`` (a tensor or a tuple / list of them) as host tensors."""
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self._host[id(t)] = t

    def unmark(self, tensor: torch.Tensor) -> None:
        self._host.pop(id(tensor), None)

    def is_host(self, tensor: torch.Tensor) -> bool:
        return self._host.get(id(tensor)) is tensor

    def read(self, what: str, tensor: torch.Tensor) -> None:
        if self.on_gpu and tensor.device.type == "cpu":
            return
        site = f"{what} at {_project_site()}"
        if self.is_host(tensor):
            self.host_reads += 1
            self.host_read_sites[site] += 1
            return
        self.reads += 1
        self.read_sites[site] += 1

    def __enter__(self) -> HostWork:
        self._modes = [_CountReads(self), _CountOps(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def summary(self, sites: int = 12) -> dict[str, Any]:
        return {"ops": self.ops, "reads": self.reads,
                "read_sites": [{"site": s, "calls": n} for s, n in self.read_sites.most_common(sites)],
                "host_reads": self.host_reads,
                "host_read_sites": [{"site": s, "calls": n} for s, n in self.host_read_sites.most_common(sites)]}

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
(UniMatch's CutMix boxes from a CPU generator) waits for nothing. On CPU every tensor is on the host, so such draws
count too; ``read_sites`` tells them apart.
"""

from __future__ import annotations

import collections
import traceback
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: tensor methods that hand a device value to Python
READ_METHODS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__format__"})
#: operators whose output shape depends on the input's values (the host waits for them on CUDA)
DATA_DEPENDENT_OPS = frozenset({"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive"})
PROJECT_DIRS = ("/npsemiseg/", "/semiseg_platform/")


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
        if name in READ_METHODS and args and isinstance(args[0], torch.Tensor):
            self.work.read(name, args[0])
        return func(*args, **(kwargs or {}))


class HostWork:
    """Context manager counting operator calls and host reads (module docstring) of the code it wraps."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.on_gpu = device is not None and torch.device(device).type != "cpu"
        self.ops = 0
        self.reads = 0
        self.read_sites: collections.Counter[str] = collections.Counter()
        self._modes: list[Any] = []

    def read(self, what: str, tensor: torch.Tensor) -> None:
        if self.on_gpu and tensor.device.type == "cpu":
            return
        self.reads += 1
        self.read_sites[f"{what} at {_project_site()}"] += 1

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
                "read_sites": [{"site": s, "calls": n} for s, n in self.read_sites.most_common(sites)]}

"""Checkpoint I/O: atomic writes with a ``latest`` pointer, resolution of a checkpoint root, exact restore.

A checkpoint holds every module of the framework, its extra state, the optimiser, the schedule and
data position, every rank's RNG states and the evaluation history, so N steps + checkpoint + restore
+ N steps gives the same weights as 2N straight steps.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from npsemiseg.callbacks import Callbacks
from npsemiseg.constants import CONFIG_FILE, STATE_FILE
from npsemiseg.config import RunConfig
from npsemiseg.frameworks import Framework
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.training.data_order import derive_seed
from npsemiseg.training.plan import Plan
from npsemiseg.untrusted import load_torch_file

CHECKPOINT_FORMAT = 1
LATEST_FILE = "latest"


#: What a checkpoint written before its RNG states were plain data holds beyond them: numpy's legacy
#: ``get_state()`` tuple pickles its ``uint32 [624]`` MT19937 key as an ndarray. Allowed for checkpoints only.
_MULTIARRAY = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray  # numpy 2 / 1.26
LEGACY_NUMPY_GLOBALS = (_MULTIARRAY._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)))


def rng_state() -> dict[str, Any]:
    """This process's torch (CPU and, when initialised, CUDA), numpy and python RNG states, as tensors and
    plain data (numpy's ``get_state(legacy=False)`` dict with its key as a list of ints), so a checkpoint
    loads with ``weights_only=True``."""
    numpy_state = np.random.get_state(legacy=False)
    inner = numpy_state["state"]
    numpy_state = {"bit_generator": str(numpy_state["bit_generator"]),
                   "state": {"key": [int(k) for k in inner["key"]], "pos": int(inner["pos"])},
                   "has_gauss": int(numpy_state["has_gauss"]), "gauss": float(numpy_state["gauss"])}
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state` (numpy's state as that dict, or the legacy tuple of older checkpoints)."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])  # takes both: the key list is converted to uint32 exactly
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(root: Path, *, step: int, state: dict[str, Any], config: RunConfig, keep: int) -> Path:
    """Write ``state`` under ``root/step_XXXXXXXX`` atomically (temporary directory + rename), point
    ``root/latest`` at it and keep only the newest ``keep`` checkpoints. Returns the directory."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:08d}"
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    torch.save(state, tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(config.to_yaml())
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".{LATEST_FILE}-{uuid.uuid4().hex[:8]}"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / LATEST_FILE)
    existing = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in existing[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from itself or from a checkpoint root: the ``step_*`` directory of the root that
    ``latest`` names, else (``latest`` missing, stale after an interruption, or naming anything but a
    ``step_*`` directory of this root) the newest complete ``step_*`` directory."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    if (path / LATEST_FILE).is_file():
        name = (path / LATEST_FILE).read_text().strip()
        candidate = path / name
        if name.startswith("step_") and name[5:].isdigit() and (candidate / STATE_FILE).is_file():
            return candidate
    complete = sorted(p for p in path.glob("step_*") if (p / STATE_FILE).is_file())
    if complete:
        return complete[-1]
    raise ValueError(f"resume_from: {path} is neither a checkpoint directory (with {STATE_FILE}) nor a "
                     f"checkpoint root with a valid '{LATEST_FILE}' file")


def load_checkpoint(path: Path, *, what: str = "resume_from") -> dict[str, Any]:
    """``path/state.pt`` read as data (``weights_only=True``; checkpoints come from others too): anything
    beyond tensors, plain containers, optimiser states and :data:`LEGACY_NUMPY_GLOBALS` is refused with
    :class:`~npsemiseg.untrusted.UnsafeFileError` naming the file and the global, nothing of it run."""
    return load_torch_file(path / STATE_FILE, what=what, allow=LEGACY_NUMPY_GLOBALS)


@contextlib.contextmanager
def reading(path: Path, what: str) -> Iterator[None]:
    """The block puts ``path``'s contents into a model: a missing entry, a wrong type or a tensor of another
    shape (a file from someone else, or of another configuration) is one ``ValueError`` line naming the file."""
    try:
        yield
    except KeyError as error:
        raise ValueError(f"{what}: {path} lacks the entry {error} (not a complete file of this format)") from None
    except (RuntimeError, TypeError, AttributeError, IndexError) as error:  # load_state_dict: keys and shapes
        detail = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise ValueError(f"{what}: {path} does not fit the model its configuration builds: {detail[:400]}") from None


def restore(path: Path, config: RunConfig, framework: Framework, optimizer: torch.optim.Optimizer,
            *, rank: int, best: Any = None) -> tuple[int, list[dict[str, float]]]:
    """Load a checkpoint into the framework, optimiser, this rank's RNGs and ``best`` (the run's
    :class:`~npsemiseg.training.selection.BestWeights`, when given); returns (step, history)."""
    state = load_checkpoint(path)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"resume_from: {path} has checkpoint format {found}, expected {CHECKPOINT_FORMAT}")
    with reading(path / STATE_FILE, "resume_from"):
        if state["cell_id"] != config.cell_id:
            raise ValueError(f"resume_from: {path} belongs to cell {state['cell_id']}, this run is cell {config.cell_id}")
        modules = framework.modules()
        if set(state["modules"]) != set(modules):
            raise ValueError(f"resume_from: {path} holds modules {sorted(state['modules'])}, expected {sorted(modules)}")
        for name, module in modules.items():
            unwrap(module).load_state_dict(state["modules"][name])
        framework.load_state_dict(state["framework"])
        optimizer.load_state_dict(state["optimizer"])
        if best is not None:
            best.load(state.get("best"))
        rngs = state["rng"]
        if rank < len(rngs):
            set_rng_state(rngs[rank])
        else:  # more ranks than when the checkpoint was written: a fresh, reproducible stream
            torch.manual_seed(derive_seed(config.seed, "train", rank, state["step"]))
        return int(state["step"]), list(state.get("history", []))


class Checkpointer:
    """Writes the run's checkpoints under ``runtime.output_dir/checkpoints`` (nothing when it is unset)
    and reports each through ``callbacks.on_checkpoint``; ``last`` is the newest directory written."""

    def __init__(self, config: RunConfig, framework: Framework, optimizer: torch.optim.Optimizer, plan: Plan,
                 callbacks: Callbacks, *, rank: int, world_size: int, best: Any = None) -> None:
        output_dir = config.runtime.output_dir
        self.root = Path(output_dir) / "checkpoints" if output_dir else None
        self.config, self.framework, self.optimizer, self.plan = config, framework, optimizer, plan
        self.callbacks, self.rank, self.world_size = callbacks, rank, world_size
        self.best = best  # the run's BestWeights (evaluation.select), saved with every checkpoint
        self.last: Path | None = None

    def save(self, step: int, metrics: dict[str, float], history: list[dict[str, float]]) -> None:
        """Checkpoint at ``step`` (every rank calls it: the RNG states of all ranks are gathered)."""
        if self.root is None:
            return
        rngs = [rng_state()]
        if self.world_size > 1:
            rngs = [None] * self.world_size  # type: ignore[list-item]
            dist.all_gather_object(rngs, rng_state())
        if self.rank == 0:
            self.last = save_checkpoint(self.root, step=step, state=self._state(step, rngs, history),
                                        config=self.config, keep=self.config.runtime.keep_checkpoints)
        if self.world_size > 1:
            dist.barrier()
        directory = self.last if self.last is not None else self.root / f"step_{step:08d}"
        self.callbacks.on_checkpoint(step, directory, metrics)

    def _state(self, step: int, rngs: list[Any], history: list[dict[str, float]]) -> dict[str, Any]:
        plan = self.plan
        return {
            "format": CHECKPOINT_FORMAT, "cell_id": self.config.cell_id, "step": step,
            "modules": {name: unwrap(m).state_dict() for name, m in self.framework.modules().items()},
            "framework": self.framework.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": {"step": step, "total_steps": plan.total_steps, "power": self.config.schedule.poly_power},
            "data": {"epoch": step // plan.iters_per_epoch, "batch": step % plan.iters_per_epoch},
            "rng": rngs, "world_size": self.world_size, "history": history,
            "best": self.best.state() if self.best is not None else None,
        }

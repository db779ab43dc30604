"""A trained cell's model for inference: rebuilt from a checkpoint or an exported file.

``load_model(path)`` returns a :class:`SegmentationModel` whose ``predict(images)`` gives the
labels and the uncertainty (entropy of the mean prediction, nats) of a batch of images.
``path`` is a file written by :func:`export_model` (the configuration and the weights of the
evaluated model, NP memories and centers included) or a checkpoint directory written by training
(``state.pt`` + ``config.yaml``, or a checkpoint root with ``latest`` / ``step_*``). Both are read
with ``weights_only=True`` (:mod:`npsemiseg.untrusted`): a file asking to run code is refused.
The model is the framework's evaluation model (the teacher where there is one), rebuilt from the
configuration without its pretrained ``model.weights`` (the file holds every weight). No MLflow,
no Ray: the platform resolves run ids to checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn

from npsemiseg import __version__
from npsemiseg.config import RunConfig, with_overrides
from npsemiseg.constants import CONFIG_FILE
from npsemiseg.data import build_dataset
from npsemiseg.evaluation.inference import MODES, predict
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.training.artifacts import evaluate_model
from npsemiseg.training.checkpoint import CHECKPOINT_FORMAT, LEGACY_NUMPY_GLOBALS, STATE_FILE, reading, resolve_checkpoint
from npsemiseg.training.factories import build_framework
from npsemiseg.training.step import autocast
from npsemiseg.untrusted import UnsafeFileError, load_torch_file

#: What an exported file says it is, and the version of its layout
EXPORT_KIND = "npsemiseg.model"
EXPORT_FORMAT = 1


class SegmentationModel:
    """A trained segmentor with its configuration; ``predict`` gives labels and uncertainty.

    ``mode``: the inference mode (``whole``, ``center_crop``, ``sliding``, ``sliding_global``);
    ``num_samples``: T predictions per pixel for stochastic heads (NP, MC dropout; None = the
    configuration's ``evaluation.num_samples``), ignored by deterministic heads; ``seed``: the
    RNG of stochastic heads (None = not reseeded). ``step``: the training step of the weights.
    """

    def __init__(self, config: RunConfig, model: nn.Module, *, step: int, mode: str = "whole",
                 num_samples: int | None = None, seed: int | None = 0) -> None:
        self.config, self.model, self.step = config, model.eval(), step
        self.mode, self.num_samples, self.seed = check_mode(mode), check_samples(num_samples), seed

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def class_names(self) -> list[str]:
        return list(self.config.dataset_info.class_names or [str(k) for k in range(self.num_classes)])

    @property
    def stochastic(self) -> bool:
        """Whether the head samples (NP, MC dropout): only then does T matter."""
        return bool(getattr(unwrap(self.model).head, "stochastic", True))

    @property
    def device(self) -> torch.device:
        parameter = next(self.model.parameters(), None)
        return parameter.device if parameter is not None else torch.device("cpu")

    def to(self, device: str | torch.device) -> SegmentationModel:
        self.model.to(device)
        return self

    def samples(self, num_samples: int | None = None) -> int | None:
        """The T used: ``num_samples``, else this model's, else the configuration's; None for deterministic heads."""
        if not self.stochastic:
            return None
        return check_samples(num_samples) or self.num_samples or self.config.evaluation.num_samples

    def predict_probs(self, images: Tensor, *, mode: str | None = None,
                      num_samples: int | None = None) -> tuple[Tensor, Tensor]:
        """``images [B, 3, H, W]`` in [0, 1] -> mean probabilities ``[B, K, H', W']`` and their entropy
        ``[B, H', W']`` (nats); ``H' x W'`` = the image size (center_crop: the evaluated region)."""
        mode = check_mode(mode or self.mode)
        device = self.device
        devices = [device.index or 0] if device.type == "cuda" else []
        evaluation = self.config.evaluation
        with torch.random.fork_rng(devices=devices), autocast(self.config, device):
            if self.seed is not None:
                torch.manual_seed(self.seed)
            probs, entropy = predict(self.model, images.to(device), mode=mode, num_samples=self.samples(num_samples),
                                     **evaluation.predict_options(mode))
        return probs.float(), entropy.float()

    def predict(self, images: Tensor, *, mode: str | None = None,
                num_samples: int | None = None) -> tuple[Tensor, Tensor]:
        """``images [B, 3, H, W]`` in [0, 1] -> ``labels [B, H', W']`` (int64 class indices) and
        ``uncertainty [B, H', W']`` (entropy of the mean prediction, nats, in [0, log K])."""
        probs, entropy = self.predict_probs(images, mode=mode, num_samples=num_samples)
        return probs.argmax(dim=1), entropy

    def evaluate(self, *, mode: str | None = None, num_samples: int | None = None, data_root: str | None = None,
                 max_images: int | None = None) -> dict[str, float]:
        """Every metric of the paper on the cell's validation split, as training evaluates (same
        seeded RNG for this step); ``mode``, ``num_samples``, ``data_root``, ``max_images`` override
        the configuration's ``evaluation`` / ``data.root``."""
        changes: dict[str, Any] = {"evaluation.mode": check_mode(mode) if mode else None,
                                   "evaluation.num_samples": check_samples(num_samples),
                                   "data.root": data_root, "evaluation.max_images": max_images}
        config = with_overrides(self.config, {k: v for k, v in changes.items() if v is not None}, from_inputs=False)
        val = build_dataset(config.dataset, "val", root=config.data.root, partition_lists=config.partition_lists,
                            **dict(config.data.options))
        return evaluate_model(self.model, val, config, step=self.step, device=self.device)

    def export(self, path: str | os.PathLike) -> Path:
        """Write this model as one self-contained file (:func:`export_model`)."""
        return export_model(self, path)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    return mode


def check_samples(num_samples: int | None) -> int | None:
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
        raise ValueError(f"num_samples: expected T >= 1, got {num_samples!r}")
    return num_samples


def _read(path: Path, *, allow: Sequence[Any] = ()) -> Any:
    """``path`` read as data (``weights_only=True``, ``allow``: the extra globals accepted); ``ValueError`` naming
    the file when it is not a readable torch file, :class:`~npsemiseg.untrusted.UnsafeFileError` when it asks to
    run code."""
    if not path.is_file():
        raise ValueError(f"checkpoint: {path} does not exist")
    try:
        return load_torch_file(path, what="checkpoint", allow=allow)
    except UnsafeFileError:
        raise
    except Exception as error:  # noqa: BLE001 - pickle, zip and torch errors alike mean "not a checkpoint"
        raise ValueError(f"checkpoint: {path} is not a readable checkpoint file ({type(error).__name__}: "
                         f"{' '.join(str(error).split())[:200]})") from None


def _evaluated_module(config: RunConfig, state: Mapping[str, Any] | None = None) -> nn.Module:
    """The framework's evaluation model rebuilt from ``config`` (no pretrained weights loaded): with
    a checkpoint's ``state``, every module and the framework's extra state restored first."""
    config = with_overrides(config, {"model.weights": None}, from_inputs=False)  # the record as trained
    framework = build_framework(config)
    if state is not None:
        modules = framework.modules()
        if set(state["modules"]) != set(modules):
            raise ValueError(f"checkpoint: holds modules {sorted(state['modules'])}, the configuration builds "
                             f"{sorted(modules)}")
        for name, module in modules.items():
            unwrap(module).load_state_dict(state["modules"][name])
        framework.load_state_dict(state["framework"])
    return unwrap(framework.eval_model())


def load_checkpoint_model(path: str | os.PathLike, **options: Any) -> SegmentationModel:
    """The evaluation model of a training checkpoint (a directory with ``state.pt`` and
    ``config.yaml``, or a checkpoint root); ``options`` go to :class:`SegmentationModel`."""
    directory = Path(path)
    if not directory.exists():
        raise ValueError(f"checkpoint: {directory} does not exist")
    if not (directory / STATE_FILE).is_file():
        try:
            directory = resolve_checkpoint(directory)
        except ValueError:
            raise ValueError(f"checkpoint: {directory} holds no checkpoint (no {STATE_FILE}, no 'latest' or "
                             "step_* checkpoint)") from None
    if not (directory / CONFIG_FILE).is_file():
        raise ValueError(f"checkpoint: {directory} has no {CONFIG_FILE} (the run's configuration)")
    state = _read(directory / STATE_FILE, allow=LEGACY_NUMPY_GLOBALS)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or "modules" not in state:
        raise ValueError(f"checkpoint: {directory / STATE_FILE} is not a training checkpoint of format {CHECKPOINT_FORMAT}")
    config = _configuration(directory / CONFIG_FILE, (directory / CONFIG_FILE).read_text())
    with reading(directory / STATE_FILE, "checkpoint"):
        return SegmentationModel(config, _evaluated_module(config, state), step=int(state["step"]), **options)


def _configuration(path: Path, text: str) -> RunConfig:
    """The run's configuration recorded in ``path`` (a checkpoint's file, an exported model); ``ValueError``
    naming the file when it is not a valid one. Read as YAML text only, never as the path of another file."""
    if not isinstance(text, str):
        raise ValueError(f"checkpoint: {path} holds a {type(text).__name__} where its run configuration (YAML text) belongs")
    try:
        return RunConfig.from_yaml(text + "\n")  # the newline: text, even when it looks like a .yaml path
    except (ValueError, yaml.YAMLError) as error:
        raise ValueError(f"checkpoint: {path} holds no valid run configuration: {' '.join(str(error).split())[:400]}") from None


def export_model(model: SegmentationModel, path: str | os.PathLike) -> Path:
    """One self-contained file: the configuration (YAML), the evaluated model's ``state_dict``
    (NP memories and centers are buffers, so included), the step and the library version."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"kind": EXPORT_KIND, "format": EXPORT_FORMAT, "config": model.config.to_yaml(), "step": model.step,
               "cell_id": model.config.cell_id, "version": __version__,
               "state_dict": {k: v.detach().cpu() for k, v in model.model.state_dict().items()}}
    temporary = path.with_name(f".{path.name}.partial")
    torch.save(payload, temporary)
    os.replace(temporary, path)
    return path


def load_model(path: str | os.PathLike, *, device: str | torch.device = "cpu", mode: str = "whole",
               num_samples: int | None = None, seed: int | None = 0) -> SegmentationModel:
    """A :class:`SegmentationModel` from an exported file or a checkpoint directory, on ``device``.

    Example::

        model = npsemiseg.load_model("model.pt", num_samples=8)
        labels, uncertainty = model.predict(images)   # images [B, 3, H, W] in [0, 1]
    """
    options = dict(mode=mode, num_samples=num_samples, seed=seed)
    path = Path(path)
    if path.is_dir():
        return load_checkpoint_model(path, **options).to(device)
    payload = _read(path)
    if not isinstance(payload, dict) or payload.get("kind") != EXPORT_KIND:
        raise ValueError(f"checkpoint: {path} is not an exported npsemiseg model (export one with `npsemiseg export`)")
    if payload.get("format") != EXPORT_FORMAT:
        raise ValueError(f"checkpoint: {path} has export format {payload.get('format')}, expected {EXPORT_FORMAT}")
    with reading(path, "checkpoint"):
        config = _configuration(path, payload["config"])
        module = _evaluated_module(config)
        module.load_state_dict(payload["state_dict"])
        return SegmentationModel(config, module, step=int(payload["step"]), **options).to(device)


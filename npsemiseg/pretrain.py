"""A pretrained start without downloads: the backbone trained on a labelled procedural corpus.

The paper's encoders start from ImageNet; the CPU mini-study (``jobs/specs/mini.yaml``) needs the same thing,
an encoder that already sees, without a download. ``pretrain(config)`` trains a segmentor
(``config.backbone`` + the narrow DeepLabv3+ of the smoke model) on the ``pretrain`` family of
``npsemiseg.data.study`` (star, crescent, tee, bar, hexagon x checker, rings: no shape, texture
or image in common with the study's train / val / tune splits; its own image streams and seed),
then keeps only the backbone, in the layout ``model.weights=PATH`` loads
(``npsemiseg.models.backbones.load_backbone_state_dict``). A ViT backbone (``npsemiseg.models.vit``) trains the
same way behind UniMatch V2's DPT decoder instead and keeps its timm-layout state dict
(``npsemiseg.models.vit.load_vit_state_dict``): ``pretrained:vit_mini`` is the mini-study's ViT.

Shipped: a name of ``SHIPPED`` (``pretrained:default``: ``npsemiseg/weights/default_<key>.pt``) loads the
package's file, its SHA-256 checked, and trains nothing: the weights are then the same on every machine, which a
build is not (they depend on the thread count and the CPU's kernels). ``npsemiseg pretrain`` still builds any
configuration, the default's included, into the cache.

Cache: ``<cache_dir>/<key>/backbone.pt`` where ``key`` hashes the configuration. The file is
written to a temporary name and renamed; its SHA-256 goes to ``backbone.pt.sha256`` (also
written then renamed) afterwards, so a file without a matching checksum (a crash mid-write, a
truncated copy) is never loaded: it is rebuilt. A second call with the same configuration is a
cache hit (a hash of a few hundred KB). ``cache_dir`` defaults to ``$NPSEMISEG_CACHE/pretrain``
(else ``~/.cache/npsemiseg/pretrain``). Progress goes to ``logging`` and to the optional
``npsemiseg.callbacks.Callbacks`` (the platform logs an MLflow run through them).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from npsemiseg.callbacks import Callbacks
from npsemiseg.data.info import IGNORE_INDEX
from npsemiseg.data.study import FAMILIES, STUDY_FAMILIES, StudyConfig, generate
from npsemiseg.evaluation.metrics import ConfusionMatrix
from npsemiseg.models import ViTBackbone, build_segmentor

log = logging.getLogger(__name__)

CACHE_ENV = "NPSEMISEG_CACHE"
WEIGHTS_FILE = "backbone.pt"
CHECKSUM_SUFFIX = ".sha256"
RECORD_FILE = "pretrain.json"
#: bump when the training recipe changes in a way the configuration does not show
RECIPE_VERSION = 1
PRETRAIN_OPTIMIZERS = ("adamw", "sgd")
#: fields added after a configuration was shipped: hashed into the key only when not None
KEY_WHEN_SET = ("head_channels",)


@dataclass(frozen=True)
class PretrainConfig:
    """Everything the pretrained weights depend on (hashed into the cache key).

    ``seed`` seeds the corpus images (streams of their own, never the study's) and the
    initialisation; ``corpus_size`` images of ``image_size`` px are cycled through in batches of
    ``batch_size`` for ``steps`` steps of ``optimizer`` (poly LR); ``holdout_size`` further images
    measure it. ``adamw`` is the default because it learns the corpus' shapes much sooner than
    SGD (held-out mIoU 0.414 vs 0.295 after 1000 steps, ``docs/history/learning.md``, "A pretraining that
    learns shape"); ``momentum`` only applies to ``sgd``.
    """

    backbone: str = "resnet_small"
    deep_stem: bool = False
    family: str = "pretrain"
    seed: int = 1000
    corpus_size: int = 4096
    holdout_size: int = 256
    image_size: int = 64
    steps: int = 3000
    batch_size: int = 16
    optimizer: str = "adamw"
    lr: float = 2e-3
    momentum: float = 0.9
    weight_decay: float = 1e-4
    log_every: int = 50
    #: intra-op threads of the training: its floating-point sums, and so the weights, depend on how many threads
    #: split them (1 and 2 threads give other backbones after 30 steps, and other mini-study verdicts after 3000:
    #: ``docs/learning.md``, backbones B and C), so the count is fixed here and part of the key
    threads: int = 2
    #: the baseline head's hidden width during the pretraining (None: the head's 256); the ViT's DPT ends at image
    #: size, where a 256-wide head costs most of a step. Enters the key only when set (``key``)
    head_channels: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES or self.family in STUDY_FAMILIES:
            raise ValueError(f"family: expected a corpus family other than the study's, one of "
                             f"{sorted(set(FAMILIES) - set(STUDY_FAMILIES))}, got {self.family!r}")
        if self.optimizer not in PRETRAIN_OPTIMIZERS:
            raise ValueError(f"optimizer: expected one of {list(PRETRAIN_OPTIMIZERS)}, got {self.optimizer!r}")
        for name in ("corpus_size", "holdout_size", "steps", "batch_size", "image_size", "log_every", "threads",
                     "head_channels"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")

    @property
    def key(self) -> str:
        """16 hex digits of the SHA-256 of the configuration (without ``log_every``; ``head_channels`` only when
        set, so the configurations from before it, the shipped default's included, keep their keys) and recipe
        version."""
        values = {k: v for k, v in asdict(self).items() if k != "log_every" and not (k in KEY_WHEN_SET and v is None)}
        text = json.dumps({"recipe": RECIPE_VERSION, **values}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PretrainResult:
    """Where the weights are (``path``), whether they came from the cache, and the corpus metrics."""

    path: Path
    key: str
    cache_hit: bool
    metrics: dict[str, float]
    seconds: float


#: named pretrainings a configuration can ask for as ``model.weights: pretrained:<name>``
PRETRAINED: dict[str, PretrainConfig] = {
    "default": PretrainConfig(),
    # the mini-study's ViT (patch 14, 4 blocks, width 64) behind the DPT: the ResNet's corpus family, seed, objective,
    # steps and AdamW at 56 px (a 4 x 4 patch grid), a 16-wide head, one thread (``docs/learning.md``, "The mini-study's
    # ViT": on a shared 2-core machine two threads ran its steps about 40 times slower)
    "vit_mini": PretrainConfig(backbone="vit_mini", image_size=56, head_channels=16, threads=1),
}
PRETRAINED_PREFIX = "pretrained:"

#: the package's folder of shipped weights (package data: ``pyproject.toml``)
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


@dataclass(frozen=True)
class ShippedWeights:
    """A pretraining shipped with the package: ``WEIGHTS_DIR / file``, its SHA-256, the cache key of the
    ``PretrainConfig`` that built it and the command that built it (what rebuilds it)."""

    file: str
    sha256: str
    key: str
    command: str

    @property
    def path(self) -> Path:
        return WEIGHTS_DIR / self.file


#: pretrainings the package ships: ``pretrained:<name>`` loads the file (its SHA-256 checked) and trains nothing, so
#: every machine starts from the same weights; a name not listed here is built and cached on first use.
#: ``ship_pretraining`` adds a file; ``docs/learning.md`` ("The shipped backbone") records each.
SHIPPED: dict[str, ShippedWeights] = {
    # built 2026-11-26 on a 2-core AMD EPYC VM (torch 2.14.1, 2 threads, 375 s; corpus mIoU 0.547)
    "default": ShippedWeights(file="default_716946963a2a2d28.pt",
                              sha256="65148955eff7c6ee03bc1046a8b68a6f0972faf64a44b4e8ce6fcd59f0bb4e26",
                              key="716946963a2a2d28", command="npsemiseg pretrain --ship"),
    # built 2026-11-27 on the same VM shared with other jobs (torch 2.14.1, 1 thread, 512 s; corpus mIoU 0.112)
    "vit_mini": ShippedWeights(file="vit_mini_aa13b45d8679edf6.pt",
                               sha256="641267b89d544e32e723ac6d2569c1cc670778f6f49349782765f9cb97629ec4",
                               key="aa13b45d8679edf6", command="npsemiseg pretrain --name vit_mini --ship"),
}


def shipped_weights(name: str) -> Path:
    """The shipped file of ``pretrained:<name>`` after checking its SHA-256: a missing file or another checksum is a
    ``ValueError`` saying what was expected and how to rebuild it."""
    entry = SHIPPED[name]
    rebuild = (f"reinstall the package, or rebuild it with `{entry.command}` and give that path as "
               f"model.weights=PATH (the weights then depend on this machine)")
    if not entry.path.exists():
        raise ValueError(f"model.weights: {PRETRAINED_PREFIX}{name}: the shipped file {entry.path} is missing; {rebuild}")
    found = file_sha256(entry.path)
    if found != entry.sha256:
        raise ValueError(f"model.weights: {PRETRAINED_PREFIX}{name}: {entry.path} has SHA-256 {found}, expected "
                         f"{entry.sha256} (a corrupted or replaced file); {rebuild}")
    return entry.path


def resolve_weights(weights: str | None, *, cache_dir: str | os.PathLike | None = None) -> str | None:
    """``model.weights`` as ``build_segmentor`` takes it: ``pretrained:<name>`` becomes the shipped file of
    ``SHIPPED[name]`` (SHA-256 checked) or else the cached backbone file of ``PRETRAINED[name]`` (trained first
    when the cache has none); anything else is returned unchanged. The name, not a machine's path, is what a
    cell's identity hashes."""
    if not isinstance(weights, str) or not weights.startswith(PRETRAINED_PREFIX):
        return weights
    name = weights[len(PRETRAINED_PREFIX):]
    if name not in PRETRAINED:
        raise ValueError(f"model.weights: unknown pretraining {name!r}, expected one of "
                         f"{[PRETRAINED_PREFIX + n for n in PRETRAINED]}")
    if name in SHIPPED:
        return str(shipped_weights(name))
    return str(pretrain(PRETRAINED[name], cache_dir=cache_dir).path)


def pretraining_name(config: PretrainConfig) -> str | None:
    """The name in ``PRETRAINED`` whose configuration ``config`` is (same key), or None."""
    return next((name for name, named in PRETRAINED.items() if named.key == config.key), None)


def ship_pretraining(name: str, built: Path, *, command: str, weights_dir: Path | None = None) -> ShippedWeights:
    """Copy ``built`` (a backbone ``pretrain`` wrote for ``PRETRAINED[name]``) into the package's weights folder as
    ``<name>_<key>.pt``; returns the entry to add to ``SHIPPED`` (file, SHA-256, key, ``command``)."""
    key = PRETRAINED[name].key
    target = (weights_dir or WEIGHTS_DIR) / f"{name}_{key}.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(target, Path(built).read_bytes())
    return ShippedWeights(target.name, file_sha256(target), key, command)


def default_cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV)
    return (Path(base) if base else Path.home() / ".cache" / "npsemiseg") / "pretrain"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def cached_weights(directory: Path) -> Path | None:
    """The weights file in ``directory`` when it is complete (its checksum file matches), else None."""
    weights, checksum = directory / WEIGHTS_FILE, directory / (WEIGHTS_FILE + CHECKSUM_SUFFIX)
    if not weights.exists():
        return None
    if not checksum.exists():
        log.warning("pretrain cache: %s has no checksum (partial write?); rebuilding", weights)
        return None
    if file_sha256(weights) != checksum.read_text().strip():
        log.warning("pretrain cache: %s does not match its checksum (corrupted); rebuilding", weights)
        return None
    return weights


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One builder per cache entry across processes (a second caller waits, then hits the cache)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pretrain(config: PretrainConfig | None = None, *, cache_dir: str | os.PathLike | None = None,
             callbacks: Callbacks | None = None) -> PretrainResult:
    """The pretrained backbone of ``config``: from the cache when complete, else trained and cached."""
    config = config or PretrainConfig()
    directory = Path(cache_dir or default_cache_dir()) / config.key
    start = time.perf_counter()
    with _locked(directory):
        found = cached_weights(directory)
        if found is not None:
            record = json.loads((directory / RECORD_FILE).read_text()) if (directory / RECORD_FILE).exists() else {}
            log.info("pretrain cache hit: %s", found)
            return PretrainResult(found, config.key, True, dict(record.get("metrics", {})), time.perf_counter() - start)
        log.info("pretrain cache miss (key %s): training %s for %d steps on %d corpus images",
                 config.key, config.backbone, config.steps, config.corpus_size)
        state, metrics = train_backbone(config, callbacks=callbacks)
        path = directory / WEIGHTS_FILE
        temporary = directory / f".{WEIGHTS_FILE}.{os.getpid()}.tmp"
        torch.save(state, temporary)
        os.replace(temporary, path)
        _write_atomic(directory / (WEIGHTS_FILE + CHECKSUM_SUFFIX), file_sha256(path).encode())
        record = {"key": config.key, "config": asdict(config), "metrics": metrics}
        _write_atomic(directory / RECORD_FILE, json.dumps(record, indent=2).encode())
        log.info("pretrained backbone written to %s (%s)", path, metrics)
        return PretrainResult(path, config.key, False, metrics, time.perf_counter() - start)


def _corpus_batch(corpus: StudyConfig, stream: str, indices: list[int]) -> tuple[Tensor, Tensor]:
    """Images ``[B, 3, S, S]`` and labels ``[B, S, S]`` of corpus items ``indices``."""
    pairs = [generate(corpus, stream, i) for i in indices]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _optimizer(config: PretrainConfig, parameters: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if config.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def train_backbone(config: PretrainConfig, *, callbacks: Callbacks | None = None) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Train a segmentor on the corpus with ``config.threads`` intra-op threads (the caller's count is restored
    after); returns its backbone's state dict and held-out metrics."""
    previous = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train_backbone(config, callbacks)
    finally:
        torch.set_num_threads(previous)


def _train_backbone(config: PretrainConfig, callbacks: Callbacks | None) -> tuple[dict[str, Tensor], dict[str, float]]:
    callbacks = callbacks or Callbacks()
    corpus = StudyConfig(seed=config.seed, family=config.family, image_size=config.image_size,
                         train_size=max(32, config.corpus_size), objects_per_image=(1, 4))
    num_classes = len(FAMILIES[config.family].class_names)
    torch.manual_seed(config.seed)
    head_options = {"hidden_channels": config.head_channels} if config.head_channels is not None else None
    model = build_segmentor(num_classes=num_classes, head="baseline", head_options=head_options, variant="u2pl",
                            backbone=config.backbone, deep_stem=config.deep_stem, weights=None, aspp_channels=16,
                            low_level_channels=8, representation_head=False)
    optimizer = _optimizer(config, model.parameters())
    order = torch.randperm(config.corpus_size, generator=torch.Generator().manual_seed(config.seed))
    callbacks.on_start(config, total_steps=config.steps, start_step=0, rank=0, world_size=1)
    model.train()
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = config.lr * (1 - step / config.steps) ** 0.9
        picks = [int(order[(step * config.batch_size + j) % config.corpus_size]) for j in range(config.batch_size)]
        images, labels = _corpus_batch(corpus, "pretrain", picks)
        flip = torch.rand(len(picks)) < 0.5  # horizontal flips, image and label together
        images[flip], labels[flip] = images[flip].flip(-1), labels[flip].flip(-1)
        logits = model(images).head.logits[0]
        loss = F.cross_entropy(F.interpolate(logits, size=labels.shape[-2:], mode="bilinear", align_corners=False),
                               labels, ignore_index=IGNORE_INDEX)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            logs = {"pretrain/loss": loss.item(), "pretrain/lr": optimizer.param_groups[0]["lr"]}
            log.info("pretrain step %d/%d loss %.4f", step + 1, config.steps, logs["pretrain/loss"])
            callbacks.on_step(step + 1, config.steps, logs)
    metrics = evaluate_corpus(model, corpus, config.holdout_size, num_classes)
    callbacks.on_evaluation(config.steps, metrics)
    return backbone_state(model.backbone), metrics


def backbone_state(backbone: torch.nn.Module) -> dict[str, Tensor]:
    """The backbone's tensors in the layout ``model.weights`` loads: a ResNet's own state dict, a ViT's timm
    ``VisionTransformer`` state dict (``load_vit_state_dict``), detached copies."""
    module = backbone.vit if isinstance(backbone, ViTBackbone) else backbone
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@torch.no_grad()
def evaluate_corpus(model: torch.nn.Module, corpus: StudyConfig, count: int, num_classes: int) -> dict[str, float]:
    """mIoU and pixel accuracy of ``model`` on ``count`` held-out corpus images (their own stream)."""
    model.eval()
    confusion = ConfusionMatrix(num_classes)
    for first in range(0, count, 32):
        images, labels = _corpus_batch(corpus, "pretrain_val", list(range(first, min(count, first + 32))))
        logits = model(images).head.logits[0]
        pred = F.interpolate(logits, size=labels.shape[-2:], mode="bilinear", align_corners=False).argmax(1)
        confusion.update(pred, labels)
    result = confusion.compute()
    return {"miou": float(result["miou"]), "pixel_acc": float(result["pixel_acc"])}

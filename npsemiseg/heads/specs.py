"""What each classifier head is, without its network: the head registry and the built-in heads' descriptions.

A registry entry (:class:`HeadSpec`) says what a configuration needs to know of a head (its label, its options
with their defaults and value checks, its paper and smoke options) and where its ``nn.Module`` class is
(``implementation``, ``"module:attribute"``), which is imported only when a head is built (:meth:`HeadSpec.load`).
So reading and checking a configuration imports no torch. The network classes inherit their spec
(``class NPHead(NPHeadSpec, ClassifierHead)``); a plug-in head registers its network class itself, which is then
its own spec (``implementation`` empty, options read from its constructor).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

from npsemiseg._registry import Registry, load_implementation

#: every head by name: a built-in head's spec (below), or a plug-in's ``ClassifierHead`` subclass
HEADS: Registry[Any] = Registry("head")

#: the NP head's choices (``npsemiseg.heads.np_kernels`` / ``np_layers`` implement them)
ATTENTIONS = ("euclidean", "squared", "per_channel", "mean")
DECODER_IMPLS = ("split", "concat")
DECODER_NORMS = ("instance", "group", "batch")
MEMORY_ROWS = ("pixel", "scrambled")
ENQUEUE_ORDERS = ("random", "stream")
MEMORY_RESOLUTIONS = ("features", "labels")
KL_FORMS = ("paper", "authors")
#: ``feature_pool`` that the segmentor resolves from its decoder (``Segmentor``'s builder: 4 on the DPT, 1 on
#: DeepLabv3+), the ``corrected`` protocol's value (switch ``np_feature_pool``)
COARSE_POOL = "coarse"
#: the baseline head's layers (option ``block``): U2PL's classifier block, or one 1x1 convolution to the classes,
#: UniMatch V2's DPT's class projection (``model/semseg/dpt.py`` 115-121, ``output_conv.2``; switch
#: ``unimatch_v2_projection_head``)
BASELINE_BLOCKS = ("u2pl", "projection")
#: the paper's memory length Q and KL weight lambda_kl (its hyper-parameter study's chosen values)
PAPER_MEMORY_SIZE, PAPER_LAMBDA_KL = 2560, 0.005


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``, else a ValueError naming the option and the accepted values."""
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    return value


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


class HeadSpec:
    """A head as a configuration sees it. A new option of a built-in head: a keyword of its network's constructor
    *and* an entry of ``default_options`` here (``tests/test_registry.py`` checks that both agree)."""

    #: ``"module:attribute"`` of the ``ClassifierHead`` subclass; empty: this class is the network class
    implementation: ClassVar[str] = ""
    #: how tables name the head beside the framework ("" for the baseline: the framework alone)
    label: ClassVar[str] = ""
    #: one line for the MLflow UI and the CLI's help
    description: ClassVar[str] = ""
    #: True when repeated calls on the same input give different logits (MC dropout, NP)
    stochastic: bool = False
    #: True when the head's buffers are memories a teacher copies from the student rather than averages (NP)
    has_memories: ClassVar[bool] = False
    #: name of the loss term ``HeadOutput.aux_loss`` is optimised as (NP: ``kl``); None: the head has none
    aux_loss_term: ClassVar[str | None] = None
    #: the ``paper`` preset's options of this head (``build_head`` keywords) and its max gradient norm
    paper_options: ClassVar[Mapping[str, Any]] = {}
    paper_grad_clip: ClassVar[float | None] = None
    #: the ``smoke`` preset's options (small memories so that a few steps fill them)
    smoke_options: ClassVar[Mapping[str, Any]] = {}
    #: option -> default (the constructor's keywords after the two sizes); None: read from the constructor
    default_options: ClassVar[Mapping[str, Any] | None] = None

    @classmethod
    def load(cls) -> type:
        """The head's network class (its module imported now)."""
        return load_implementation(cls)

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """The head's options with their defaults: constructor keywords after the two sizes."""
        if cls.default_options is not None:
            return dict(cls.default_options)
        params = list(inspect.signature(cls.__init__).parameters.values())[3:]  # self, in_channels, num_classes
        return {p.name: p.default for p in params}

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """``ValueError`` naming an unknown option or a bad value, without building the head."""
        allowed = cls.option_defaults()
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for head {cls.__name__}, expected some of {sorted(allowed)}")
        cls.check_values(**{**allowed, **dict(options)})

    @classmethod
    def check_values(cls, **options: Any) -> None:
        """Value checks of the options (every option given); subclasses with constraints override it."""


@HEADS.register("baseline")
class BaselineHeadSpec(HeadSpec):
    """The plain classifier block (``npsemiseg.heads.classifier.BaselineHead``)."""

    implementation = "npsemiseg.heads.classifier:BaselineHead"
    description = "the deterministic baseline classifier (one prediction)"
    default_options = {"dropout": 0.1, "hidden_channels": 256, "block": "u2pl"}

    @classmethod
    def check_values(cls, *, dropout: float, hidden_channels: int, block: str = "u2pl", **_: object) -> None:
        positive_int("hidden_channels", hidden_channels)
        check_choice("block", block, BASELINE_BLOCKS)


@HEADS.register("mc_dropout")
class MCDropoutHeadSpec(BaselineHeadSpec):
    """The classifier block with dropout active in ``eval()`` (``npsemiseg.heads.classifier.MCDropoutHead``)."""

    implementation = "npsemiseg.heads.classifier:MCDropoutHead"
    stochastic = True
    label = "MC dropout"
    description = "MC dropout (uncertainty from T dropout samples)"
    smoke_options = {"training_samples": 2}
    default_options = {"dropout": 0.1, "training_samples": 5, "train_mode_passes": 1, "hidden_channels": 256}

    @classmethod
    def check_values(cls, *, dropout: float, hidden_channels: int,  # type: ignore[override]
                     training_samples: int = 5, train_mode_passes: int = 1, **_: object) -> None:
        super().check_values(dropout=dropout, hidden_channels=hidden_channels)
        if not dropout > 0.0:
            raise ValueError(f"dropout: MC dropout needs a probability in (0, 1), got {dropout}")
        positive_int("training_samples", training_samples)
        positive_int("train_mode_passes", train_mode_passes)


@HEADS.register("np")
class NPHeadSpec(HeadSpec):
    """NP-SemiSeg's head (``npsemiseg.heads.np_head.NPHead``; its options: ``docs/np_head.md``)."""

    implementation = "npsemiseg.heads.np_head:NPHead"
    stochastic = True
    label = "NP-SemiSeg"
    description = "the NP-SemiSeg neural-process head (uncertainty from T latent samples)"
    aux_loss_term = "kl"
    has_memories = True
    #: lambda_kl, memory length Q and T of the paper, gradient norm clipped at 5.0 (``docs/np_head.md``, "Hyper-parameters")
    paper_options = {"lambda_kl": PAPER_LAMBDA_KL, "memory_size": PAPER_MEMORY_SIZE, "training_samples": 5}
    paper_grad_clip = 5.0
    smoke_options = {
        "lambda_kl": PAPER_LAMBDA_KL,
        "memory_size": 64,
        "training_samples": 2,
        "latent_dim": 8,
        "hidden_channels": 16,
        "enqueue_per_class": 16,
    }
    default_options = {
        "latent_dim": 32, "memory_size": PAPER_MEMORY_SIZE, "training_samples": 5, "attention": "euclidean",
        "kl": "paper", "decoder_impl": "split", "enqueue_per_class": "auto", "lambda_kl": PAPER_LAMBDA_KL,
        "detach_query": True, "mask_empty": True, "sync_memories": True, "decoder_norm": "instance",
        "hidden_channels": 256, "memory_rows": "pixel", "persist_memories": True, "memory_zero_row": False,
        "enqueue_order": "random", "memory_resolution": "features", "feature_pool": 1,
    }

    @classmethod
    def check_values(
        cls,
        *,
        latent_dim: int,
        memory_size: int,
        training_samples: int,
        attention: str,
        kl: str,
        decoder_impl: str,
        enqueue_per_class: int | str | None,
        lambda_kl: float,
        decoder_norm: str,
        hidden_channels: int,
        memory_rows: str = "pixel",
        enqueue_order: str = "random",
        memory_resolution: str = "features",
        feature_pool: int | str = 1,
        **flags: bool,
    ) -> None:
        if feature_pool != COARSE_POOL:
            positive_int("feature_pool", feature_pool)
        for name, value in (
            ("latent_dim", latent_dim),
            ("memory_size", memory_size),
            ("training_samples", training_samples),
            ("hidden_channels", hidden_channels),
        ):
            positive_int(name, value)
        check_choice("attention", attention, ATTENTIONS)
        check_choice("kl", kl, KL_FORMS)
        check_choice("decoder_impl", decoder_impl, DECODER_IMPLS)
        check_choice("decoder_norm", decoder_norm, DECODER_NORMS)
        check_choice("memory_rows", memory_rows, MEMORY_ROWS)
        check_choice("enqueue_order", enqueue_order, ENQUEUE_ORDERS)
        check_choice("memory_resolution", memory_resolution, MEMORY_RESOLUTIONS)
        if enqueue_per_class not in (None, "auto") and positive_int("enqueue_per_class", enqueue_per_class) > memory_size:
            raise ValueError(f"enqueue_per_class: expected at most memory_size={memory_size}, got {enqueue_per_class}")
        if not (isinstance(lambda_kl, (int, float)) and lambda_kl >= 0.0):
            raise ValueError(f"lambda_kl: expected a number >= 0, got {lambda_kl!r}")

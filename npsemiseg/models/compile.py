"""``runtime.compile``: the segmentor's networks under ``torch.compile`` (inductor), the step around them eager.

What is compiled (:func:`compile_segmentor`), each module in place with ``nn.Module.compile`` so that its
``state_dict`` keys stay as they are (no ``_orig_mod.`` prefix; checkpoints of compiled and eager runs are
interchangeable): the encoder, the decoder, the auxiliary and representation heads, and the classifier head's
networks (:meth:`~npsemiseg.heads.base.ClassifierHead.compiled_networks`: the baseline / MC-dropout block; the NP
head's query ConvNet, latent encoder and decoder). What stays eager: the segmentor's and the heads' Python around
them (MC dropout's S decoder passes, input checks), the NP memories' updates (random subsets of data-dependent
size), the frameworks' steps (U2PL's anchor sampling, CutMix, pseudo-labels) and the losses.

Random numbers: inductor's ``fallback_random`` runs random ops (dropout masks, ``randn``) as eager's kernels on
the same generator, so a compiled step draws what the eager step draws from the same seed
(``tests/test_compile.py`` checks losses and gradients for every framework x head).

Modes (``runtime.compile``): ``default``; ``max-autotune`` (GEMM / convolution autotuning, and CUDA graphs on
CUDA as ``torch.compile``'s mode); ``reduce-overhead`` (CUDA graphs: shapes must be static, which the training
step's are: fixed crops and batches). CUDA graphs do not exist on CPU, so ``reduce-overhead`` there is a
``ValueError`` (:func:`check_compile_device`) rather than a silent ``default``: timings of the two must not be
mistaken for each other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: ``runtime.compile`` values besides ``off``, with whether the mode records CUDA graphs
COMPILE_MODES = {"default": False, "reduce-overhead": True, "max-autotune": True}


def compile_options(mode: str) -> dict[str, Any]:
    """Inductor options of ``torch.compile`` mode ``mode`` with ``fallback_random`` (eager's random draws)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"runtime.compile: expected one of {['off', *COMPILE_MODES]}, got {mode!r}")
    from torch._inductor import list_mode_options

    return {**list_mode_options(mode), "fallback_random": True}


def check_compile_device(mode: str, device: torch.device) -> None:
    """``ValueError`` for ``reduce-overhead`` (CUDA graphs only) on a device other than CUDA."""
    if mode == "reduce-overhead" and device.type != "cuda":
        raise ValueError(f"runtime.compile='reduce-overhead' records CUDA graphs, which need a CUDA device; "
                         f"the run is on {device.type!r}: use runtime.compile='default' there")


def uses_cuda_graphs(mode: str, device: torch.device) -> bool:
    """Whether ``runtime.compile=mode`` records CUDA graphs on ``device`` (each step then marks its start)."""
    return device.type == "cuda" and COMPILE_MODES.get(mode, False)


def trunk_networks(segmentor: nn.Module) -> list[nn.Module]:
    """The segmentor's networks before the classifier head: encoder, decoder, aux / representation heads (when
    present)."""
    parts = [segmentor.backbone, segmentor.decoder, segmentor.aux_head, segmentor.representation_head]
    return [m for m in parts if m is not None]


def compiled_networks(segmentor: nn.Module) -> list[nn.Module]:
    """The modules :func:`compile_segmentor` compiles: the trunk's networks and the classifier head's."""
    return trunk_networks(segmentor) + list(segmentor.head.compiled_networks())


def compile_segmentor(segmentor: nn.Module, mode: str) -> nn.Module:
    """Compile ``segmentor``'s networks (module docstring) in place with ``runtime.compile=mode``; ``off``
    leaves it as it is. Returns ``segmentor``. Compilation itself happens at each network's first call."""
    if mode == "off":
        return segmentor
    options = compile_options(mode)
    for module in compiled_networks(segmentor):
        module.compile(options=options)
    return segmentor


def to_channels_last(segmentor: nn.Module) -> nn.Module:
    """``runtime.channels_last``: the encoder's, decoder's and aux / representation heads' weights in
    ``torch.channels_last`` memory format, in place (their convolutions then run channels-last on channels-last
    images). The classifier head keeps NCHW weights: the NP decoder's kernels view NCHW maps in place, and the heads'
    convolutions are a small share of the step. Returns ``segmentor``."""
    for module in trunk_networks(segmentor):
        module.to(memory_format=torch.channels_last)
    return segmentor


def is_compiled(module: nn.Module) -> bool:
    """True when ``module`` was compiled in place (``nn.Module.compile``)."""
    return getattr(module, "_compiled_call_impl", None) is not None

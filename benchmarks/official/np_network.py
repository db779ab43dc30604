"""The project's NP network behind the NP-SemiSeg authors' interfaces (Jianf-Wang/NP-SemiSeg): the project's encoder,
decoder and representation head around the authors' ``NP_HEAD`` holding the project head's weights (:data:`HEAD_MAP`,
:func:`authors_head`), written out as the authors' U2PL and AugSeg ``ModelBuilder.forward`` (:class:`AuthorsModel`,
:class:`AugSegAuthorsModel`); what the NP golden recorders (``tests/golden/record_np_u2pl_step_golden.py``,
``record_np_augseg_step_golden.py``) and the whole runs (:mod:`official.u2pl`, :mod:`official.augseg`) share."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from official_side_by_side import IMAGENET_MEAN, IMAGENET_STD

#: the project's NP head parameters (prefix ``head.``) -> the authors' ``NP_HEAD`` parameters
HEAD_MAP = {"query_net.0": "memory_dim_transform.Conv_1.0", "query_net.3": "memory_dim_transform.Conv_1.3",
            "query_net.6": "memory_dim_transform.Conv_1.6", "latent_encoder.mlp.0": "mean_logvar_net.MLP.L0",
            "latent_encoder.mlp.2": "mean_logvar_net.MLP.L1", "decoder.conv1": "decoder.Conv_Decoder.0",
            "decoder.tail.2": "decoder.Conv_Decoder.3", "decoder.tail.5": "decoder.Conv_Decoder.6"}
#: the patches of both authors' scripts (U2PL's and AugSeg's ``train_semi.py`` with the NP head) beside the network's
NP_PATCHES = (
    ("NP_HEAD's Conv_Decoder (its 3x3 convolutions, 256 wide in the code)",
     "the same layers at the cell's head.options.hidden_channels",
     "the mini study narrows the heads' 3x3 blocks to 64 channels (NP_HEAD takes latent_dim and memory_max_length "
     "as arguments: the cell's)"),
    ("the NP memories' initial rows (main: torch.zeros((1, 32)) per class)", "zeros of the cell's latent_dim",
     "the cell's latent width (2 in the mini study, jobs/specs/mini.yaml) is not the code's 32"),
    ("the list arguments of the network's forward (this torch's DDP hands a CPU module its lists as they are)",
     "copies, as the authors' torch 1.10 DDP scattered its inputs (NPInterface)",
     "the memories the NP head writes never reach main's lists (deviation N2, what the authors' runs did): every "
     "epoch starts from them and validation uses their zero centers"),
    ("DistributedDataParallel's device_ids (None for a CPU module)", "[0], read as no device ids by DDP's forward",
     "main reads model.device_ids[0] for its .cuda(...) calls (no-ops here)"),
)
#: the latent width the authors' loops hard-code for the memories' initial rows (``torch.zeros((1, 32))``)
AUTHORS_LATENT = 32


def reorder_decoder_input(weight: Tensor, channels: int, latent: int, to: str) -> Tensor:
    """The NP decoder's first convolution between the authors' input order ``[z, x, r]`` and ours ``[x, z, r]``."""
    c, d = channels, latent
    if to == "ours":
        return torch.cat([weight[:, d:d + c], weight[:, :d], weight[:, d + c:]], dim=1)
    return torch.cat([weight[:, c:c + d], weight[:, :c], weight[:, c + d:]], dim=1)


def narrowed_decoder(head: nn.Module, ours: nn.Module) -> None:
    """The authors' ``Conv_Decoder`` (3x3 convolutions 256 wide, hard-coded) with each mapped convolution of
    another shape replaced by one of the project decoder's shape (same kernel, padding and bias): the cell's
    ``hidden_channels``; its instance norms (no parameters: ``affine=False``) of the same width. Nothing changes at
    256."""
    state = dict(ours.named_parameters())
    layers = head.decoder.Conv_Decoder
    for mapped, theirs in HEAD_MAP.items():
        if not theirs.startswith("decoder.Conv_Decoder."):
            continue
        index, shape = int(theirs.rsplit(".", 1)[1]), state[f"{mapped}.weight"].shape
        conv = layers[index]
        if conv.weight.shape != shape:
            layers[index] = nn.Conv2d(shape[1], shape[0], conv.kernel_size, conv.stride, conv.padding, bias=True,
                                      dtype=conv.weight.dtype)
    for index, layer in enumerate(layers):  # each instance norm of its convolution's width (no parameters)
        if isinstance(layer, nn.InstanceNorm2d) and layer.num_features != layers[index - 1].out_channels:
            layers[index] = nn.InstanceNorm2d(layers[index - 1].out_channels)


def authors_head(module: types.ModuleType, segmentor: nn.Module, config: Any) -> nn.Module:
    """The authors' ``NP_HEAD`` (of ``module``, their ``np_head.py``) at ``config``'s sizes (its NP head options:
    latent width, memory length; its classes; the decoder narrowed to the project's width, :func:`narrowed_decoder`)
    holding the weights of ``segmentor``'s NP head (:data:`HEAD_MAP`)."""
    options = config.head.options
    ours = segmentor.head
    head = module.NP_HEAD(input_dim=ours.in_channels, latent_dim=options["latent_dim"], num_classes=config.num_classes,
                          memory_max_length=options["memory_size"]).to(next(ours.parameters()).dtype)
    narrowed_decoder(head, ours)
    state = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in head.named_parameters():
            mapped = next(k for k, v in HEAD_MAP.items() if name.startswith(v + "."))
            value = state[f"{mapped}.{name.rsplit('.', 1)[1]}"].detach()
            if mapped == "decoder.conv1" and name.endswith("weight"):
                value = reorder_decoder_input(value, head.input_dim, head.latent_dim, "authors")
            p.copy_(value)
    return head


class AuthorsModel(nn.Module):
    """The authors' U2PL ``ModelBuilder`` (no aux head; ``model_helper.py`` 48-95, ``decoder.py`` 111-156: encoder on
    the targets and on the context, decoder on both, the NP head, the representation on the targets) around the
    project's encoder, decoder and representation head with the authors' ``NP_HEAD`` as ``classifier1``;
    ``device_ids`` as the DDP module the loop reads. Images in [0, 1] (the project's encoder normalises)."""

    def __init__(self, segmentor: nn.Module, np_head: nn.Module) -> None:
        super().__init__()
        segmentor.head = None  # the authors' head classifies
        self.segmentor, self.classifier1 = segmentor, np_head
        self.device_ids = [0]

    def forward(self, x, deterministic_memory, latent_memory, x_context_in=None, labels_target_in=None,
                labels_context_in=None, forward_times=5, phase_train=True):
        if isinstance(deterministic_memory, list):  # as the loop's DDP forward: the head writes into copies
            deterministic_memory, latent_memory = list(deterministic_memory), list(latent_memory)
        seg = self.segmentor
        feat = seg.encode(x)  # model_helper.py 89-91: encoder on the targets, then on the context
        feat_c = seg.encode(x_context_in) if phase_train else None
        aspp_out = seg.decoder(feat.low_level, feat.high_level)  # decoder.py 112-120
        context = seg.decoder(feat_c.low_level, feat_c.high_level) if feat_c is not None else None  # 124-134
        if phase_train:  # decoder.py 138-147
            output, mean, sigma, mean_c, sigma_c, deterministic_memory, latent_memory = self.classifier1(
                aspp_out, deterministic_memory, latent_memory, x_context_in=context, labels_target_in=labels_target_in,
                labels_context_in=labels_context_in, forward_times=forward_times, phase_train=phase_train)
            res = {"pred": output, "mean_t": mean, "sigma_t": sigma, "mean_c": mean_c, "sigma_c": sigma_c,
                   "deterministic_memory": deterministic_memory, "latent_memory": latent_memory}
        else:
            res = {"pred": self.classifier1(aspp_out, deterministic_memory, latent_memory, forward_times=forward_times,
                                            phase_train=phase_train)}
        res["rep"] = seg.representation_head(aspp_out)
        return res


class AugSegAuthorsModel(AuthorsModel):
    """The authors' AugSeg ``ModelBuilder`` (no aux head, ``model_helper.py`` 100-125, ``decoder.py`` 55-88) around
    the project's encoder and decoder with the authors' ``NP_HEAD``: logits ``[T, B, K, H, W]`` upsampled per sample
    (``align_corners=True``); in training also the latent statistics and the memory lists the head returns."""

    def forward(self, x, deterministic_memory, latent_memory, flag_use_fdrop=False, x_context_in=None,
                labels_target_in=None, labels_context_in=None, forward_times=5, phase_train=True):
        seg, size = self.segmentor, x.shape[-2:]
        feat = seg.encode(x)  # model_helper.py 110-111: encoder on the targets, then on the context
        feat_c = seg.encode(x_context_in) if phase_train else None
        aspp_out = seg.decoder(feat.low_level, feat.high_level)  # decoder.py 56-66
        if phase_train:
            context = seg.decoder(feat_c.low_level, feat_c.high_level)  # decoder.py 68-78
            outs, mean, sigma, mean_c, sigma_c, deterministic_memory, latent_memory = self.classifier1(
                aspp_out, deterministic_memory, latent_memory, x_context_in=context, labels_target_in=labels_target_in,
                labels_context_in=labels_context_in, forward_times=forward_times, phase_train=phase_train)
            return self.upsample(outs, size), None, mean, sigma, mean_c, sigma_c, deterministic_memory, latent_memory
        outs = self.classifier1(aspp_out, deterministic_memory, latent_memory, forward_times=forward_times,
                                phase_train=phase_train)
        return self.upsample(outs, size), None

    @staticmethod
    def upsample(outs: Tensor, size) -> Tensor:
        """model_helper.py 113-116: ``[T, B, K, h, w]`` -> ``[T, B, K, H, W]``."""
        t, b, k, h, w = outs.shape
        return F.interpolate(outs.reshape(t * b, k, h, w), size, mode="bilinear", align_corners=True).view(t, b, k, *size)


def authors_model(model_class: type[AuthorsModel], module: types.ModuleType, segmentor: nn.Module,
                  config: Any) -> AuthorsModel:
    """``model_class`` around ``segmentor`` with the authors' ``NP_HEAD`` of ``module`` holding its head's weights."""
    return model_class(segmentor, authors_head(module, segmentor, config))


def copied_lists(value: Any) -> Any:
    """A list argument copied (torch 1.10's DDP forward scattered its inputs: a list reached the module as a new
    list, so what the head wrote into it never reached the caller: the authors' memories never persist, deviation
    N2); anything else as it is."""
    return list(value) if isinstance(value, list) else value


class NPInterface(nn.Module):
    """An :class:`AuthorsModel` behind the authors' ``ModelBuilder`` in their loop: ``encoder`` (the backbone: the
    optimiser's group at ``lr``), ``decoder`` (the decoder, the authors' NP head and the representation head where
    there is one: at ``lr x 10``); inputs normalised with ImageNet's mean and std (the official loaders') given back
    in [0, 1] (targets and context); list arguments copied as torch 1.10's DDP copied them (:func:`copied_lists`:
    this torch's DDP hands a CPU module its lists as they are)."""

    def __init__(self, authors: AuthorsModel) -> None:
        super().__init__()
        self.authors = authors
        seg = authors.segmentor
        self.encoder = seg.backbone
        self.decoder = nn.ModuleList([seg.decoder, authors.classifier1,
                                      *([seg.representation_head] if seg.representation_head is not None else [])])
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("x_context_in") is not None:
            kwargs["x_context_in"] = kwargs["x_context_in"] * self.std + self.mean
        return self.authors(x * self.std + self.mean, *map(copied_lists, args), **kwargs)


class RankZero(list):
    """``[0]`` that tests false: ``model.device_ids[0]`` for the authors' ``.cuda(...)`` calls (no-ops here), while DDP's
    forward, which moves its inputs to ``device_ids[0]`` when there are any, sees none."""

    def __bool__(self) -> bool:
        return False


def with_device_ids(ddp: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """``ddp`` (the CPU run's DDP) whose modules' ``device_ids`` are :class:`RankZero`."""
    def wrap(*args: Any, **kwargs: Any) -> nn.Module:
        model = ddp(*args, **kwargs)
        model.device_ids = RankZero([0])
        return model
    return wrap


def np_script_patches(module: types.ModuleType, train: Callable[..., Any], width: int) -> list[tuple[Any, str, Any]]:
    """What an authors' script (``module``, its ``train``, already wrapped as the run needs) needs beside the network:
    memories of the latent ``width`` (:func:`with_memories`) and DDP's ``device_ids`` (:func:`with_device_ids`)."""
    return [(module, "train", with_memories(train, width)),
            (nn.parallel, "DistributedDataParallel", with_device_ids(nn.parallel.DistributedDataParallel))]


def with_memories(train_function: Callable[..., Any], width: int) -> Callable[..., Any]:
    """The authors' ``train(model, model_teacher, latent_memory, deterministic_memory, ...)`` given memories whose
    initial rows are zeros ``width`` wide where ``main`` makes them :data:`AUTHORS_LATENT` wide (``main`` hands its
    lists to every epoch and takes its validation centers from them: replaced in place, once)."""
    def train(*args: Any) -> Any:
        for memory in args[2:4]:
            if memory[0].shape[1] != width:
                memory[:] = [torch.zeros(1, width) for _ in memory]
        return train_function(*args)
    return train

"""The project's segmentor split into PS-MT's parts (``VocCode/Model/Deeplabv3_plus``): an ``EncoderNetwork``'s place
(:class:`Encoder`: backbone + decoder), an ``upsample`` module's place (:class:`Upsample`: the classifier head) and an
``EntireModel`` holding three of them (:func:`entire_model`). The PS-MT golden recorder
(``tests/golden/record_psmt_step_golden.py``) and the official whole run (:mod:`official.psmt`) both map the project's
networks onto the official model this way."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: the official model's parts of each network: (suffix of ``encoder<suffix>`` / ``decoder<suffix>``, network, the
#: name of its official decoder class in ``encoder_decoder``: the student's holds the T-VAT perturbation)
PARTS = (("1", "teacher1", "DecoderNetwork"), ("2", "teacher2", "DecoderNetwork"), ("_s", "student", "VATDecoderNetwork"))


class Encoder(nn.Module):
    """An official ``EncoderNetwork``'s place: the segmentor's backbone and decoder (``extract``: the feature map
    T-VAT perturbs); its state dict is theirs, so ``update_teachers`` averages exactly these."""

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        self.backbone, self.decoder = segmentor.backbone, segmentor.decoder
        object.__setattr__(self, "segmentor", segmentor)  # not a submodule: the head belongs to the decoder side

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        return self.segmentor.extract(data)


class Upsample(nn.Module):
    """An official ``upsample`` module's place: the segmentor's classifier head, its logits upsampled to
    ``data_shape`` (the crop in training, the given shape in eval) with ``align_corners=True`` (105-116)."""

    def __init__(self, head: nn.Module, data_shape: list[int]) -> None:
        super().__init__()
        self.head, self.data_shape = head, data_shape

    def forward(self, x: torch.Tensor, data_shape=None) -> torch.Tensor:
        pred = self.head(x).logits[0]
        h, w = self.data_shape if self.training or data_shape is None else data_shape
        return F.interpolate(pred, size=(h, w), mode="bilinear", align_corners=True)


def shell(cls: type, **modules: nn.Module) -> nn.Module:
    """An instance of the official module class ``cls`` holding ``modules`` (its own layers not built)."""
    obj = cls.__new__(cls)
    nn.Module.__init__(obj)
    for name, module in modules.items():
        setattr(obj, name, module)
    return obj


def entire_model(entire_model_class: type, encoder_decoder: object, networks: dict[str, nn.Module],
                 data_shape: list[int]) -> nn.Module:
    """A shell of the official ``entire_model_class`` (``EntireModel``) whose ``encoder1`` / ``encoder2`` /
    ``encoder_s`` and ``decoder1`` / ``decoder2`` / ``decoder_s`` are the halves of ``networks`` (``teacher1``,
    ``teacher2``, ``student``): an :class:`Encoder` each and a shell of ``encoder_decoder``'s decoder class
    (:data:`PARTS`) whose ``upsample`` is an :class:`Upsample` of the network's head to ``data_shape``. Its mode,
    losses and weights are the caller's to set."""
    parts: dict[str, nn.Module] = {}
    for suffix, name, decoder in PARTS:
        parts[f"encoder{suffix}"] = Encoder(networks[name])
        parts[f"decoder{suffix}"] = shell(getattr(encoder_decoder, decoder),
                                          upsample=Upsample(networks[name].head, data_shape))
    return shell(entire_model_class, **parts)

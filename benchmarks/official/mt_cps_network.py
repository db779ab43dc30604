"""The project's segmentors behind TorchSemiSeg's MeanTeacher ``Network`` (``exp.voc/voc8.res50v3+.MeanTeacher/
network.py``): a :class:`Branch` in each ``SingleNetwork``'s place and a ``Network`` holding the student's and the
teacher's (:func:`mean_teacher_network`). The MT-CPS golden recorder (``tests/golden/record_mt_cps_golden.py``) and
the official whole run (:mod:`official.mt_cps`) both map the project's networks onto the official model this way."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from official_side_by_side import IMAGENET_MEAN, IMAGENET_STD


class Branch(nn.Module):
    """A ``SingleNetwork``'s place (network.py 50-80) around the project's segmentor ``model``: in training
    ``(features, logits upsampled to the image with align_corners=True)``, in eval the logits only; ``backbone`` and
    ``business_layer`` (the decoder and the classifier head) are the groups train.py gives the optimiser
    (``group_weight``, 94-100). Both are properties, not submodules: the state dict is ``model``'s. ``normalised``:
    the input is normalised with ImageNet's mean and std (the official loaders' and evaluator's), and the project's
    model, which normalises inside, gets the image back in [0, 1]; otherwise the input goes to the model as it is (the
    golden recorder feeds both sides the same images)."""

    def __init__(self, model: nn.Module, normalised: bool = False) -> None:
        super().__init__()
        self.model, self.normalised = model, normalised
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    @property
    def backbone(self) -> nn.Module:
        return self.model.backbone

    @property
    def business_layer(self) -> list[nn.Module]:
        return [self.model.decoder, self.model.head]

    def forward(self, data: torch.Tensor):
        out = self.model(data * self.std + self.mean if self.normalised else data)
        pred = F.interpolate(out.head.logits[0], size=data.shape[-2:], mode="bilinear", align_corners=True)
        return (out.features, pred) if self.training else pred


def mean_teacher_network(network_class: type, student: nn.Module, teacher: nn.Module,
                         normalised: bool = False) -> nn.Module:
    """An instance of the official ``network_class`` (``Network``; its ``SingleNetwork`` branches not built) whose
    ``branch1`` (the student) and ``branch2`` (the teacher) are :class:`Branch` es of ``student`` and ``teacher``, the
    teacher's parameters detached as ``Network.__init__`` detaches them (21-23): its ``forward`` and
    ``_update_ema_variables`` the official ones; ``normalised``: :class:`Branch`'s."""
    network = network_class.__new__(network_class)
    nn.Module.__init__(network)
    network.branch1, network.branch2 = Branch(student, normalised), Branch(teacher, normalised)
    for param in network.branch2.parameters():
        param.detach_()
    return network

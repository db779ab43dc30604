"""The DINOv2 encoder and the DPT decoder reproduce UniMatch V2's forward (``tests/golden/dinov2_dpt.npz``, recorded by
``tests/golden/record_dinov2_dpt_golden.py``; source, command and what was compared in ``dinov2_dpt.json``).

The official ``DinoVisionTransformer.get_intermediate_layers`` and ``DPT.forward`` ran on a tiny ViT (width 32, 4
blocks, 56 px pretraining grid) with pattern weights in the official key layout; here the project's ``vit_tiny``
backbone loads that official-layout state dict through ``load_vit_state_dict`` (timm's key mapping: ``mask_token``
dropped) and the DPT decoder loads the head's weights but ``output_conv.2`` (the class projection, applied here
as a 1x1 conv, then the official upsampling). Both sides run in float64 (``REC.DTYPE``), but for the position
embedding's bicubic resize, which the official code does in float32 (``dinov2.py`` 185) and the project alike; its
float32 kernels differ between CPUs. Tolerance :data:`RTOL_SCALE`: ``1e-5 x max(1, max |theirs|)``. Measured max
|difference| relative to max(1, max |theirs|) (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with
ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/MKL_ENABLE_INSTRUCTIONS; ``pytest -s tests/test_dinov2_dpt_golden.py`` under
each): intermediate maps 2.6e-15 and logits 1.2e-14 natively (AVX-512), on AVX2 (``avx2``/``AVX2``/``AVX2``) and with 2
threads; 6.5e-7 and 2.6e-7 on the portable path (``default``/``SSE41``/``SSE4_2``, 1 thread), where the float32 resize
rounds otherwise (the official forward moves as much between those paths): a margin of 15. Negative case: timm's own
position-embedding resize (``resample_abs_pos_embed``, ``size=`` instead of the official ``scale_factor = (grid +
0.1) / sqrt(N)``) moves the first map by 0.90, so the golden guards the official resize.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from torch import nn

from golden_files import recorded, recorder, sidecar
from npsemiseg.models import DPTDecoder, build_vit_backbone
from npsemiseg.models.vit import load_vit_state_dict

RTOL_SCALE = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

REC = recorder("dinov2_dpt")
DATA = recorded("dinov2_dpt")
META = sidecar("dinov2_dpt")


def _official_state() -> dict[str, torch.Tensor]:
    return REC.pattern_state(META["official_shapes"])


def _part(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _encoder():
    backbone = build_vit_backbone(REC.BACKBONE).eval()
    load_vit_state_dict(backbone, _part(_official_state(), "backbone."), source="the recorded official layout")
    return backbone.to(REC.DTYPE)


def _images() -> torch.Tensor:
    return torch.from_numpy(DATA["images"]).to(REC.DTYPE)


def _max_diff(ours: torch.Tensor, theirs: np.ndarray) -> tuple[float, float]:
    diff = float(np.max(np.abs(ours.detach().double().numpy() - theirs.astype(np.float64))))
    return diff, RTOL_SCALE * max(1.0, float(np.max(np.abs(theirs))))


def test_the_recorded_network_is_the_vit_tiny_backbone():
    backbone = build_vit_backbone(REC.BACKBONE)
    spec = backbone.spec
    sizes = META["sizes"]
    assert (spec.embed_dim, spec.depth, spec.num_heads, spec.img_size) == (sizes["embed_dim"], sizes["depth"],
                                                                           sizes["heads"], sizes["img_size"])
    assert list(spec.layers) == sizes["layers"] and spec.dpt_features == sizes["features"]
    assert list(spec.dpt_channels) == sizes["channels"]


def test_intermediate_layers_equal_the_official_encoder():
    with torch.no_grad():
        layers = _encoder().intermediate_layers(_images())
    seen = []
    for i, layer in enumerate(layers):
        diff, bound = _max_diff(layer, DATA[f"layer{i}"])
        assert diff <= bound, f"layer {i}: max |difference| {diff:.3g} > {bound:.3g}"
        seen.append(diff * RTOL_SCALE / bound)
    print(json.dumps({"layers": f"{max(seen):.2e}"}))


def test_the_dpt_forward_equals_the_official_dpt():
    state = _official_state()
    head = _part(state, "head.")
    decoder = DPTDecoder(REC.EMBED_DIM, REC.FEATURES, REC.CHANNELS).eval()
    decoder.load_state_dict({k: v for k, v in head.items() if not k.startswith("scratch.output_conv.2.")})
    classifier = nn.Conv2d(REC.FEATURES, REC.NUM_CLASSES, 1)
    classifier.load_state_dict(_part(head, "scratch.output_conv.2."))
    decoder.to(REC.DTYPE)
    classifier.to(REC.DTYPE)
    images = _images()
    with torch.no_grad():
        encoded = _encoder()(images)
        features = decoder(encoded.low_level, encoded.high_level)
        logits = F.interpolate(classifier(features), size=images.shape[-2:], mode="bilinear", align_corners=True)
    h, w = images.shape[-2] // 14, images.shape[-1] // 14
    assert features.shape == (images.shape[0], REC.FEATURES, 8 * h, 8 * w)
    diff, bound = _max_diff(logits, DATA["logits"])
    assert diff <= bound, f"logits: max |difference| {diff:.3g} > {bound:.3g}"
    print(json.dumps({"logits": f"{diff * RTOL_SCALE / bound:.2e}"}))


def test_timms_own_position_resize_is_told_apart():
    """The negative case: the same network with timm's ``size=`` resize of the position embedding."""
    backbone = _encoder()
    grid = (DATA["images"].shape[-2] // 14, DATA["images"].shape[-1] // 14)
    backbone.position_embedding = lambda h, w: resample_abs_pos_embed(  # type: ignore[method-assign]
        backbone.vit.pos_embed, new_size=[h, w], num_prefix_tokens=1)
    with torch.no_grad():
        layer = backbone.intermediate_layers(_images())[0]
    assert layer.shape[-2:] == grid
    diff, bound = _max_diff(layer, DATA["layer0"])
    print(json.dumps({"timm_resize_moves": f"{diff:.2e}"}))
    assert diff > 100 * bound, f"timm's resize is within {diff:.3g} of the official one: the golden cannot tell them apart"

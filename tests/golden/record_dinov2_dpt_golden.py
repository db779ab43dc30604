"""Record UniMatch V2's DINOv2 encoder and DPT forward on a tiny ViT: ``tests/golden/dinov2_dpt.npz``.

Usage (from the repository root; CHECKOUT is a checkout of LiheYoung/UniMatch-V2)::

    PYTHONPATH=$PWD python tests/golden/record_dinov2_dpt_golden.py CHECKOUT [--out tests/golden]

What is official and what is not. The official ``DinoVisionTransformer`` (``model/backbone/dinov2.py``) and ``DPT``
/ ``DPTHead`` (``model/semseg/dpt.py``, ``model/util/blocks.py``) are imported from CHECKOUT at run time and run
the forward: ``get_intermediate_layers`` (final norm, class token dropped) and ``DPT.forward`` (the head, then
bilinear upsampling to the image with ``align_corners=True``). Only the sizes are not the published ones: the
ViT is built with the official constructor at the arguments of ``DINOv2(...)`` (patch 14, ``init_values`` 1,
MLP FFN, no chunks, no registers, ``interpolate_offset`` 0.1) but a width of 32, 4 blocks, 2 heads and a 56 px
pretraining size (a 4 x 4 position grid), and the DPT reads blocks 0-3 with features 16 and projections
8/16/32/32: the project's ``vit_tiny`` backbone. ``DPT.__init__`` builds a full ViT-S; its ``backbone`` and
``head`` are replaced by the tiny ones before any forward. ``comp_drop`` (CUDA only) is not run here.

Weights: every official parameter gets the deterministic pattern :func:`pattern_weights` of its shape, salted by a
CRC of its name (norm weights and LayerScale gammas around 1), so the test rebuilds the same official-layout state
dict from the names and shapes in the sidecar without the official code. Inputs: two images of 42 x 70 px, a 3 x 5
patch grid, so the official position-embedding resize (``scale_factor = (grid + 0.1) / sqrt(N)``) runs.
Precision (:data:`DTYPE`): the network runs in float64 (pattern weights: float32 values, widened; the images:
float32 values, exact in float64; float64 the default dtype around the forward), float32 only where the official
code fixes it: the position embedding's resize (``dinov2.py`` 185, ``.float()``), as the project's ``vit_tiny``. In
float32 the forward's round-off differs between CPUs by up to a third of the test's bound.
Stored: the images (float32), the four intermediate maps ``[B, D, 3, 5]`` and the DPT's logits ``[B, K, 42, 70]``
(float64).
"""

from __future__ import annotations

import sys
import zlib
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import (  # noqa: E402
    default_dtype,
    official_commit,
    official_sidecar,
    recorder_arguments,
    save_golden,
    sine_pattern,
)

OFFICIAL_FILES = ("model/backbone/dinov2.py", "model/semseg/dpt.py", "model/util/blocks.py",
                  "model/backbone/dinov2_layers/block.py", "model/backbone/dinov2_layers/attention.py")
STEM = "dinov2_dpt"
BACKBONE = "vit_tiny"
EMBED_DIM, DEPTH, HEADS, IMG_SIZE = 32, 4, 2, 56
LAYERS = [0, 1, 2, 3]
FEATURES, CHANNELS = 16, [8, 16, 32, 32]
NUM_CLASSES = 5
BATCH, HEIGHT, WIDTH = 2, 42, 70
SEED = 20262
#: the forward's precision on both sides (module docstring)
DTYPE = torch.float64


def pattern_weights(name: str, shape: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """Deterministic float32 weights for parameter ``name``: :func:`recording.sine_pattern` salted by
    ``crc32(name) % 9973 + salt``, plus 1 for norm weights and LayerScale gammas (which sit around 1 in a trained network)."""
    values = sine_pattern(shape, zlib.crc32(name.encode()) % 9973 + salt)
    if name.endswith("gamma") or (".norm" in f".{name}" and name.endswith("weight")):
        values = values + 1.0
    return torch.from_numpy(values).float()


def pattern_state(shapes: dict[str, list[int]], salt: int = 0) -> dict[str, torch.Tensor]:
    """The official-layout state dict of ``shapes`` (name -> shape) filled with :func:`pattern_weights`."""
    return {name: pattern_weights(name, tuple(shape), salt) for name, shape in shapes.items()}


def images() -> torch.Tensor:
    """``[B, 3, 42, 70]``, roughly ImageNet-normalised values: standard normal, float32, from NumPy's generator (the
    same values on every CPU, which ``torch.randn``'s vectorised draw is not)."""
    values = np.random.default_rng(SEED).standard_normal((BATCH, 3, HEIGHT, WIDTH))
    return torch.from_numpy(values).float()


def official_dpt(checkout: Path, salt: int = 0) -> torch.nn.Module:
    """The official ``DPT`` with the tiny ViT and DPT head (module docstring), pattern weights loaded."""
    sys.path.insert(0, str(checkout))
    try:
        from model.backbone.dinov2 import DinoVisionTransformer  # noqa: PLC0415 - the official files, from CHECKOUT
        from model.backbone.dinov2_layers import MemEffAttention, NestedTensorBlock  # noqa: PLC0415
        from model.semseg.dpt import DPT, DPTHead  # noqa: PLC0415
    finally:
        sys.path.remove(str(checkout))
    dpt = DPT(encoder_size="small", nclass=NUM_CLASSES, features=FEATURES, out_channels=CHANNELS)
    dpt.backbone = DinoVisionTransformer(
        img_size=IMG_SIZE, patch_size=14, embed_dim=EMBED_DIM, depth=DEPTH, num_heads=HEADS, mlp_ratio=4,
        block_fn=partial(NestedTensorBlock, attn_class=MemEffAttention), init_values=1.0, ffn_layer="mlp",
        block_chunks=0, num_register_tokens=0, interpolate_antialias=False, interpolate_offset=0.1)
    dpt.head = DPTHead(NUM_CLASSES, EMBED_DIM, FEATURES, False, out_channels=CHANNELS)
    dpt.intermediate_layer_idx = {"small": LAYERS}
    shapes = {k: list(v.shape) for k, v in dpt.state_dict().items()}
    dpt.load_state_dict(pattern_state(shapes, salt))
    return dpt.eval()


def record(checkout: Path) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    torch.set_num_threads(1)
    dpt = official_dpt(checkout).to(DTYPE)
    x = images()
    with torch.no_grad(), default_dtype(DTYPE):
        layers = dpt.backbone.get_intermediate_layers(x.to(DTYPE), LAYERS, reshape=True)
        logits = dpt(x.to(DTYPE))
    out = {"images": x.numpy(), "logits": logits.numpy()}
    out.update({f"layer{i}": layer.numpy() for i, layer in enumerate(layers)})
    return out, {k: list(v.shape) for k, v in dpt.state_dict().items()}


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of UniMatch-V2", argv)
    commit = args.commit or official_commit(args.checkout)
    arrays, shapes = record(args.checkout)
    sidecar = {
        **official_sidecar("UniMatch V2's DINOv2 intermediate layers and DPT forward on a tiny ViT "
                           "(tests/test_dinov2_dpt_golden.py).", "https://github.com/LiheYoung/UniMatch-V2",
                           args.checkout, commit, OFFICIAL_FILES),
        "sources": {
            "encoder": "model/backbone/dinov2.py 179-231 (interpolate_pos_encoding, prepare_tokens_with_masks), 271-321 "
                       "(get_intermediate_layers with norm; imported and run), 400-417 (the DINOv2(...) arguments)",
            "dpt": "model/semseg/dpt.py 22-109 (DPTHead), 141-172 (DPT.forward without comp_drop); "
                   "model/util/blocks.py (FeatureFusionBlock, ResidualConvUnit); imported and run",
        },
        "compared": "the tiny ViT's four intermediate maps and the DPT's logits at the image size; the official "
                    "network built at tiny sizes (module docstring), pattern weights from the names and shapes below",
        "command": f"PYTHONPATH=$PWD python tests/golden/record_dinov2_dpt_golden.py CHECKOUT --commit {commit}",
        "sizes": {"backbone": BACKBONE, "embed_dim": EMBED_DIM, "depth": DEPTH, "heads": HEADS, "img_size": IMG_SIZE,
                  "layers": LAYERS, "features": FEATURES, "channels": CHANNELS, "num_classes": NUM_CLASSES,
                  "images": [BATCH, 3, HEIGHT, WIDTH], "seed": SEED},
        "dtype": "float64 forward (weights and images float32 values, widened); float32 in the position embedding's "
                 "resize, where dinov2.py 185 fixes it; images stored as float32, the maps and logits as float64",
        "official_shapes": shapes,
        "torch": torch.__version__,
    }
    save_golden(args.out, STEM, arrays, sidecar)
    print(f"logits: mean {float(arrays['logits'].mean()):.6f} std {float(arrays['logits'].std()):.6f}")


if __name__ == "__main__":
    main()

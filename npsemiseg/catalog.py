"""The names of the built-in frameworks, heads, datasets and presets, importable without torch.

What the command line's help lists (``npsemiseg run --help`` answers without importing a network). The
registries stay the one place a name is looked up; ``tests/test_cli_startup.py`` checks that importing the
packages registers exactly these names, in this order.
"""

from __future__ import annotations

#: ``npsemiseg.frameworks.framework_names()`` of the built-in frameworks, in the paper's order
FRAMEWORK_NAMES = ("supervised", "mt", "mt_cps", "psmt", "u2pl", "augseg", "fixmatch", "unimatch", "unimatch_v2",
                   "fixmatch_v2")
#: ``npsemiseg.heads.head_names()``
HEAD_NAMES = ("baseline", "mc_dropout", "np")
#: ``npsemiseg.data.dataset_names()``: the real datasets, then the synthetic stand-ins and the mini-study's
DATASET_NAMES = ("pascal_classic", "pascal_blender", "cityscapes", "ade20k", "coco", "synthetic", "synthetic_voc",
                 "synthetic_blender", "synthetic_cityscapes", "study")
#: ``npsemiseg.presets.preset_names()``
PRESET_NAMES = ("paper", "smoke")

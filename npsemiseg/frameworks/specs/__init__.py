"""Every built-in framework as a configuration sees it (options, decoder, augmentation, paper settings), without
torch; importing this package registers them in :data:`FRAMEWORKS`, in the paper's order."""

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec

# the built-in frameworks, in the paper's order: importing them registers them
from npsemiseg.frameworks.specs import supervised, mt, mt_cps, psmt, u2pl, augseg, fixmatch, unimatch  # noqa: E402,F401  isort: skip
from npsemiseg.frameworks.specs import unimatch_v2  # noqa: E402,F401  isort: skip  (unimatch_v2, fixmatch_v2)

__all__ = ["FRAMEWORKS", "FrameworkOptions", "FrameworkSpec"]

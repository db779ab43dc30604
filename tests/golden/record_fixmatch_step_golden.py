"""Record one whole training step of FixMatch as LiheYoung/UniMatch runs it (``fixmatch.py``):
``tests/golden/fixmatch_step_<setting>.npz``, ``setting`` = ``pascal`` or ``cityscapes``.

Usage (from the repository root; CHECKOUT is a checkout of LiheYoung/UniMatch)::

    PYTHONPATH=$PWD python tests/golden/record_fixmatch_step_golden.py CHECKOUT [--out tests/golden]

The same recorder as UniMatch's (``record_unimatch_step_golden.py``, whose docstring says what is official and what
is not) with the loop body, optimiser lines and loss terms of ``fixmatch.py``: one strong view, no feature
perturbation (no channel masks), ``loss = (loss_x + loss_u_s) / 2``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_unimatch_step_golden import main  # noqa: E402

if __name__ == "__main__":
    main(framework="fixmatch")

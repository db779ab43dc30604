"""Record the blur kernel PS-MT's released strong view draws for given uniform numbers:
``tests/golden/psmt_blur_kernel_released.json`` (the record is small enough to be the sidecar itself).

Usage (from the repository root; CHECKOUT is a checkout of PS-MT, https://github.com/yyliu01/PS-MT)::

    PYTHONPATH=$PWD python tests/golden/record_psmt_blur_kernel_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``BaseDataSet.data_aug`` is imported from ``VocCode/Base/base_dataset.py`` of CHECKOUT at run time (nothing of it
is kept here) and run on a small PIL image once per number u of :data:`UNIFORMS`: the module's ``random.random``
returns u (the kernel draw), then 0.9 (no colour jitter) and 0.0 (the blur applies); its
``transforms.GaussianBlur`` is wrapped to keep the kernel size it is built with. The module imports cv2 at its
top, which ``data_aug`` does not call: an empty stand-in module that fails on any use takes its place (cv2 is not
installed here).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torchvision
from PIL import Image
from torchvision import transforms as tv_transforms

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402


OFFICIAL_FILE = "VocCode/Base/base_dataset.py"
#: the uniform numbers: a grid and both sides of each boundary of int(u x 4.95)
UNIFORMS = (0.0, 0.1, 0.2020, 0.2021, 0.3, 0.4040, 0.4041, 0.5, 0.6060, 0.6061, 0.7, 0.8080, 0.8081, 0.9, 0.999999)


class _NoCv2(types.ModuleType):
    def __getattr__(self, name: str):
        raise RuntimeError(f"cv2.{name} used: the recorded function must not need cv2")


def official_module(checkout: Path):
    saved = sys.modules.get("cv2")
    sys.modules["cv2"] = _NoCv2("cv2")
    try:
        spec = importlib.util.spec_from_file_location("psmt_base_dataset", checkout / OFFICIAL_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["cv2"]
        else:
            sys.modules["cv2"] = saved
    return module


def record(checkout: Path) -> list[int]:
    module = official_module(checkout)
    kernels: list[int] = []

    class Transforms:
        """torchvision.transforms with GaussianBlur wrapped to keep its kernel size."""

        def __getattr__(self, name: str):
            return getattr(tv_transforms, name)

        @staticmethod
        def GaussianBlur(kernel_size, sigma):  # noqa: N802 - torchvision's name
            kernels.append(int(kernel_size))
            return tv_transforms.GaussianBlur(kernel_size, sigma=sigma)

    module.transforms = Transforms()
    image = Image.fromarray((np.arange(8 * 8 * 3).reshape(8, 8, 3) * 5 % 256).astype(np.uint8))
    for u in UNIFORMS:
        draws = iter((u, 0.9, 0.0))
        module.random = types.SimpleNamespace(random=lambda draws=draws: next(draws))
        module.BaseDataSet.data_aug(image)
        assert next(draws, None) is None, "data_aug drew another number of random.random"
    return kernels



def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of PS-MT", argv)
    kernels = record(args.checkout)
    sidecar = {
        "about": "The blur kernel of PS-MT's released strong view for given uniform numbers "
                 "(tests/test_psmt_blur_kernel_golden.py).",
        "repository": "https://github.com/yyliu01/PS-MT",
        "commit": args.commit or official_commit(args.checkout),
        "official_file_sha256": hashlib.sha256((args.checkout / OFFICIAL_FILE).read_bytes()).hexdigest(),
        "sources": {"data_aug": f"{OFFICIAL_FILE} 133-153 (kernel_size = int(random.random() * 4.95), made odd)"},
        "command": "PYTHONPATH=$PWD python tests/golden/record_psmt_blur_kernel_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": f"CHECKOUT holds {OFFICIAL_FILE} at the commit, e.g. git archive COMMIT {OFFICIAL_FILE} | "
                    "tar -x -C CHECKOUT",
        "torchvision": torchvision.__version__,
        "uniforms": list(UNIFORMS),
        "kernels": kernels,
    }
    save_golden(args.out, "psmt_blur_kernel_released", None, sidecar)


if __name__ == "__main__":
    main()

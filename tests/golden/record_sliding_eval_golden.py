"""Record what UniMatch's released sliding-window evaluation predicts on fixed small images:
``tests/golden/sliding_eval_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of UniMatch, https://github.com/LiheYoung/UniMatch)::

    PYTHONPATH=$PWD python tests/golden/record_sliding_eval_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``evaluate`` is imported from ``supervised.py`` of CHECKOUT at run time (nothing of it is kept here; ``unimatch.py``
and ``fixmatch.py`` call this function) and run in mode ``sliding_window`` on the images below, one per batch, with
the small network :class:`Net` (logits at the input's size, as UniMatch's DeepLabv3+). ``.cuda()`` returns the tensor
itself, ``dist.all_reduce`` sums over one process (it returns its input), TensorBoard (not installed) is a stand-in
the function never calls. Recorded: the window of every call of the network (its rows and columns, read back from
the coordinates the images carry), the classes the evaluation passes to ``intersectionAndUnion`` (the argmax of the
summed softmaxes), and its mIoU and per-class IoU. AugSeg's ``validate_citys`` (``train_semi.py`` 537-552) is the
same loop. The window is 8 pixels (stride ``int(8 x 2 / 3)`` = 5); the sizes give windows cut at the border on both
sides, and sides between the stride and the window, where the official loop still starts a second, cut window.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402

OFFICIAL_FILE = "supervised.py"
#: UniMatch's evaluate sums into a 19-class map whatever cfg['nclass'] says (Cityscapes' classes)
K = 19
GRID = 8
SIZES = ((21, 30), (7, 12), (16, 8))
SEED = 20271


def pattern(shape: tuple[int, ...], salt: int, scale: float) -> torch.Tensor:
    """``scale * sin(1 + 0.7 i + salt)`` over the flat index i, float32."""
    values = scale * np.sin(1.0 + 0.7 * np.arange(int(np.prod(shape)), dtype=np.float64) + float(salt))
    return torch.from_numpy(values.reshape(shape)).float()


class Net(nn.Module):
    """``images [B, 5, h, w]`` -> logits ``[B, K, h, w]``: conv 3x3 (zero padding: a window's border pixels see
    other values than inside the whole image) on the three colour channels, ReLU, conv 1x1. Channels 3 and 4 carry
    each pixel's row and column (integers), which :attr:`windows` keeps from every call, and are not read."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.classifier = nn.Conv2d(6, K, 1)
        with torch.no_grad():
            self.conv.weight.copy_(pattern(tuple(self.conv.weight.shape), 0, 1.5))
            self.conv.bias.copy_(pattern((6,), 1, 0.2))
            self.classifier.weight.copy_(pattern(tuple(self.classifier.weight.shape), 2, 1.0))
            self.classifier.bias.copy_(pattern((K,), 3, 0.1))
        self.windows: list[tuple[int, int, int, int]] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rows, cols = images[0, 3], images[0, 4]
        self.windows.append((int(rows[0, 0]), int(rows[-1, 0]) + 1, int(cols[0, 0]), int(cols[0, -1]) + 1))
        return self.classifier(torch.relu(self.conv(images[:, :3])))


def with_coordinates(image: torch.Tensor) -> torch.Tensor:
    """``image [1, 3, H, W]`` with its pixels' rows and columns as channels 3 and 4 -> ``[1, 5, H, W]``."""
    _, _, height, width = image.shape
    rows = torch.arange(height, dtype=image.dtype)[:, None].expand(height, width)
    cols = torch.arange(width, dtype=image.dtype)[None, :].expand(height, width)
    return torch.cat([image, rows[None, None], cols[None, None]], dim=1)


def inputs() -> dict[str, np.ndarray]:
    """``image{i} [1, 3, H, W]`` in [0, 1] and ``label{i} [1, H, W]`` (classes 0-3 of K) per size of :data:`SIZES`."""
    gen = torch.Generator().manual_seed(SEED)
    out = {}
    for i, (height, width) in enumerate(SIZES):
        out[f"image{i}"] = torch.rand(1, 3, height, width, generator=gen).numpy()
        out[f"label{i}"] = torch.randint(0, 4, (1, height, width), generator=gen).numpy().astype(np.int64)
    return out


@contextmanager
def official_supervised(checkout: Path):
    """``supervised`` from CHECKOUT (its imports resolved there, TensorBoard a stand-in), run on CPU in one process."""
    board = types.ModuleType("torch.utils.tensorboard")
    board.SummaryWriter = object
    saved_board = sys.modules.get("torch.utils.tensorboard")
    sys.modules["torch.utils.tensorboard"] = board
    sys.path.insert(0, str(checkout))
    cuda, all_reduce = torch.Tensor.cuda, torch.distributed.all_reduce
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.distributed.all_reduce = lambda tensor, *args, **kwargs: tensor
    try:
        yield importlib.import_module("supervised")
    finally:
        torch.Tensor.cuda, torch.distributed.all_reduce = cuda, all_reduce
        sys.path.remove(str(checkout))
        if saved_board is None:
            sys.modules.pop("torch.utils.tensorboard", None)
        else:
            sys.modules["torch.utils.tensorboard"] = saved_board


def record(checkout: Path) -> dict[str, np.ndarray]:
    torch.set_num_threads(1)  # as the test (tests/conftest.py single_seeded_thread)
    data = inputs()
    out: dict[str, np.ndarray] = dict(data)
    with official_supervised(checkout) as supervised:
        predicted: list[np.ndarray] = []
        intersection_and_union = supervised.intersectionAndUnion

        def keeping(output, target, *args, **kwargs):
            predicted.append(np.array(output, copy=True))
            return intersection_and_union(output, target, *args, **kwargs)

        supervised.intersectionAndUnion = keeping
        net = Net().eval()
        loader = [(with_coordinates(torch.from_numpy(data[f"image{i}"])), torch.from_numpy(data[f"label{i}"]), str(i))
                  for i in range(len(SIZES))]
        try:
            miou, iou_class = supervised.evaluate(net, loader, "sliding_window", {"crop_size": GRID, "nclass": K})
        finally:
            supervised.intersectionAndUnion = intersection_and_union
    assert len(predicted) == len(SIZES)
    for i, classes in enumerate(predicted):
        out[f"classes{i}"] = classes.astype(np.int64)
    out["windows"] = np.array(net.windows, dtype=np.int64)  # (top, bottom, left, right), in call order
    out["miou"] = np.array(miou, dtype=np.float64)
    out["iou_class"] = np.asarray(iou_class, dtype=np.float64)
    return out


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of UniMatch", argv)
    arrays = record(args.checkout)
    sidecar = {
        "about": "What UniMatch's released sliding-window evaluation predicts on fixed small images "
                 "(tests/test_sliding_eval_golden.py).",
        "repository": "https://github.com/LiheYoung/UniMatch",
        "commit": args.commit or official_commit(args.checkout),
        "official_file_sha256": hashlib.sha256((args.checkout / OFFICIAL_FILE).read_bytes()).hexdigest(),
        "sources": {
            "evaluate": f"{OFFICIAL_FILE} 33-85",
            "windows_and_softmax_sum": f"{OFFICIAL_FILE} 44-57",
            "miou_in_percent": f"{OFFICIAL_FILE} 82-83",
            "called_by": "unimatch.py 223, fixmatch.py 198 (eval_mode 'sliding_window' on Cityscapes)",
            "same_loop": "AugSeg@7ead870 train_semi.py 537-552 (validate_citys)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_sliding_eval_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": "CHECKOUT holds supervised.py, dataset/, model/ and util/ at the commit, e.g. git archive COMMIT "
                    "supervised.py dataset model util | tar -x -C CHECKOUT",
        "sizes": dict(K=K, grid=GRID, images=[list(s) for s in SIZES], seed=SEED),
        "torch": torch.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "sliding_eval_released", arrays, sidecar)


if __name__ == "__main__":
    main()

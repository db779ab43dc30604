"""Small files from others that ask for far more memory or time than their size are refused before it is spent
(``npsemiseg.untrusted``; ``docs/reliability.md``, "Threat model"), one test per class:

1. torch files: a pickle calling ``bytearray(n)`` (on torch's own allow-list), numpy's ``_reconstruct`` of a
   250,000,000-element shape (the checkpoints' legacy numpy allowance), a storage declaring more bytes than its record
   holds, a zip record that inflates a thousandfold (each shown with a size that fits a test machine: the
   file would be as small at any size);
2. images and label sources: an IPTC file named ``.png`` whose header says 64 x 64 around a 9000 x 9000 image, an
   EPS named ``.jpg`` (PIL would run Ghostscript on it), COCO annotations declaring a 9000 x 9000 image or an RLE
   of that size on a 64 x 64 image, an SBD ``.mat`` of 79 KB inflating to an 81 M-pixel map;
3. parses: YAML aliases (a configuration, an exported model's configuration, a ``classes.yaml``), a list nested
   5,000 deep, a grid spec of 8,000 combinations (its ``max_cells`` 1,000 by default).

Every crafted file is built here. The readers run in a fresh Python process that reports, for each call, how much
its peak resident memory grew (Linux's ``VmHWM``, reset before each call): the refusal must name the file on one
line, and the peak must not grow by more than :data:`GROWTH_LIMIT_MB` (the crafted files ask for 64 to 256 MiB;
the sizes are kept there so that a reader which stopped refusing fails the test without taking the machine down).
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from npsemiseg.untrusted import MAX_IMAGE_PIXELS

ROOT = Path(__file__).resolve().parents[1]
GROWTH_LIMIT_MB = 48

#: runs each ``(setup, call)`` after the imports; prints, per call, its error (or None) and how much the peak
#: resident memory grew during it
_PROBE = textwrap.dedent("""
    import json, sys
    def peak_kb():  # VmHWM, the peak resident memory, which writing 5 to clear_refs resets to the current
        status = open("/proc/self/status").read()
        return int(status.split("VmHWM:")[1].split()[0])
    namespace = {}
    exec(sys.argv[1], namespace)
    results = []
    for call in json.loads(sys.argv[2]):
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        before = peak_kb()
        try:
            eval(call, namespace)
            error = None
        except Exception as raised:
            error = f"{type(raised).__name__}: {raised}"
        results.append({"call": call, "error": error, "grown_mb": (peak_kb() - before) / 1024})
    print(json.dumps(results))
""")


def probe(imports: str, calls: list[str]) -> list[dict]:
    """Each of ``calls`` in one fresh process after ``imports`` (a warm-up of the same readers among them)."""
    done = subprocess.run([sys.executable, "-c", _PROBE, imports, json.dumps(calls)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=ROOT, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_refused(results: list[dict], named: dict[str, str]) -> None:
    """Every call refused with one line naming its file (``named``: call -> the path), memory unmoved."""
    for result in results:
        error, path = result["error"], named[result["call"]]
        assert error is not None and path in error and "\n" not in error, result
        assert result["grown_mb"] < GROWTH_LIMIT_MB, result


# ----------------------------------------------------------------------------- 1. torch files
def torch_zip(path: Path, data_pkl: bytes, records: dict[str, bytes] | None = None, *,
              deflate: frozenset[str] = frozenset()) -> Path:
    """A zip in torch's layout (``archive/data.pkl``, ``byteorder``, ``version``, ``data/<key>``)."""
    records = {"data.pkl": data_pkl, "byteorder": b"little", "version": b"3\n", **(records or {})}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in records.items():
            archive.writestr(f"archive/{name}", data,
                             zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
    return path


class _Storage:
    """Pickled as the persistent id of a storage of ``elements`` floats held in record ``data/<key>``."""

    def __init__(self, key: str, elements: int) -> None:
        self.key, self.elements = key, elements


class _Tensor:
    """Pickled as ``_rebuild_tensor_v2(storage, 0, shape, strides, False, OrderedDict())``."""

    def __init__(self, storage: _Storage, shape: tuple[int, ...]) -> None:
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        strides = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        return torch._utils._rebuild_tensor_v2, (self.storage, 0, self.shape, strides, False, OrderedDict())


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.elements)
        return None


def crafted_pickle(value) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(value)
    return buffer.getvalue()


def call_pickle(module: str, name: str, *args_pickle: bytes) -> bytes:
    """Protocol 2: ``module.name(*args)`` from raw opcodes (``args_pickle``: each argument's opcodes)."""
    return (b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"(" + b"".join(args_pickle) + b"tR.")


def test_torch_files_are_read_within_what_their_size_holds(tmp_path):
    huge = struct.pack("<Q", 1 << 28)  # LONG1 of 8 bytes: 256 MiB (any size: the file stays 200 bytes)
    bytearray_call = call_pickle("__builtin__", "bytearray", b"\x8a\x08" + huge)
    model = torch_zip(tmp_path / "model.pt", bytearray_call)
    # torch's own allow-list admits bytearray(n): a 32 MiB one loads (the same file, a smaller n)
    control = torch_zip(tmp_path / "control.pt", call_pickle("__builtin__", "bytearray", b"J" + struct.pack("<i", 1 << 25)))
    assert len(torch.load(control, weights_only=True)) == 1 << 25
    reconstruct = (b"\x80\x02cnumpy._core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
                   b"J\x80\xb2\xe6\x0e\x85c_codecs\nencode\nX\x01\x00\x00\x00bX\x06\x00\x00\x00latin1\x86R"
                   b"\x87R.")  # _reconstruct(ndarray, (250_000_000,), _codecs.encode("b", "latin1")), as numpy pickles
    (tmp_path / "ckpt").mkdir()
    torch_zip(tmp_path / "ckpt" / "state.pt", reconstruct)
    lying_storage = torch_zip(tmp_path / "storage.pt", crafted_pickle({"w": _Tensor(_Storage("0", 1 << 26), (1 << 26,))}),
                              {"data/0": b"\0" * 16})
    lying_view = torch_zip(tmp_path / "view.pt", crafted_pickle({"w": _Tensor(_Storage("0", 4), (1 << 15, 1 << 15))}),
                           {"data/0": b"\0" * 16})
    bomb = torch_zip(tmp_path / "weights.pt", crafted_pickle({"w": _Tensor(_Storage("0", 1 << 24), (1 << 24,))}),
                     {"data/0": b"\0" * (1 << 26)}, deflate=frozenset({"data/0"}))
    assert bomb.stat().st_size < 1 << 17  # 64 MiB of storage in under 128 KiB

    results = probe("from pathlib import Path\nfrom npsemiseg.untrusted import load_torch_file\n"
                    "from npsemiseg.training.checkpoint import load_checkpoint\n"
                    "from npsemiseg.models.backbones import read_state_dict\n"
                    "import npsemiseg\n"
                    "read_state_dict('npsemiseg/weights/vit_mini_aa13b45d8679edf6.pt')",  # warm-up: a real file
                    [f"npsemiseg.load_model({str(model)!r})", f"load_checkpoint(Path({str(tmp_path / 'ckpt')!r}))",
                     f"load_torch_file({str(lying_storage)!r}, what='weights')",
                     f"read_state_dict({str(lying_view)!r})", f"read_state_dict({str(bomb)!r})"])
    assert_refused(results, {results[0]["call"]: str(model), results[1]["call"]: str(tmp_path / "ckpt" / "state.pt"),
                             results[2]["call"]: str(lying_storage), results[3]["call"]: str(lying_view),
                             results[4]["call"]: str(bomb)})
    assert "builtins.bytearray" in results[0]["error"] and "(250000000,)" in results[1]["error"]
    assert "inflate" in results[4]["error"]

    # what torch.save writes still loads as it was: views, expanded and empty tensors, both formats
    from npsemiseg.untrusted import load_torch_file

    base = torch.arange(24.0).reshape(4, 6)
    state = {"slice": base[1:3, 2:], "t": base.t(), "expand": torch.ones(3, 1).expand(3, 5), "empty": torch.zeros(0, 7),
             "scalar": torch.tensor(2.5), "p": torch.nn.Parameter(torch.ones(2)), "set": {1, 2}, "half": base.half()}
    for legacy in (False, True):
        torch.save(state, tmp_path / "ok.pt", _use_new_zipfile_serialization=not legacy)
        loaded = load_torch_file(tmp_path / "ok.pt", what="test")
        assert all(torch.equal(loaded[k], v) for k, v in state.items() if isinstance(v, torch.Tensor)), legacy


# ----------------------------------------------------------------------------- 2. images and label sources
def iptc_around(path: Path, inner: bytes, width: int = 64, height: int = 64) -> Path:
    """An IPTC/NAA file whose header declares ``width x height`` and whose data is the image file ``inner``."""
    def field(tag: tuple[int, int], data: bytes) -> bytes:
        if len(data) < 0x8000:
            return bytes([0x1C, *tag]) + struct.pack(">H", len(data)) + data
        return bytes([0x1C, *tag, 0x84, 0]) + struct.pack(">I", len(data)) + data

    path.write_bytes(field((3, 60), b"\x01\x00") + field((3, 20), struct.pack(">I", width))
                     + field((3, 30), struct.pack(">I", height)) + field((3, 120), b"\x05") + field((8, 10), inner))
    return path


def test_images_and_label_sources_are_decoded_within_the_pixel_limit(tmp_path):
    from npsemiseg.data.sets.coco import COCO_CLASSES
    from npsemiseg.untrusted import ImageTooLargeError, decode_image

    inner = io.BytesIO()
    Image.new("L", (9000, 9000)).save(inner, format="PNG")
    iptc = iptc_around(tmp_path / "photo.png", inner.getvalue())
    with Image.open(iptc) as lying:  # PIL, without a format list: 64 x 64 on its header ...
        assert lying.format == "IPTC" and lying.size == (64, 64)
    with pytest.raises(ImageTooLargeError, match=r"photo.png holds an image of 81,000,000 pixels"):  # ... and inside
        decode_image(iptc, formats=("IPTC",))
    assert Image.MAX_IMAGE_PIXELS == MAX_IMAGE_PIXELS
    eps = tmp_path / "scan.jpg"
    eps.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 9000 9000\nshowpage\n%%EOF\n")

    categories = [{"id": i, "name": name} for i, name in enumerate(COCO_CLASSES[1:], start=1)]
    huge_image = tmp_path / "instances_huge.json"
    huge_image.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "height": 9000, "width": 9000}],
                                      "annotations": [], "categories": categories}))
    huge_rle = tmp_path / "instances_rle.json"
    huge_rle.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "height": 64, "width": 64}],
                                    "annotations": [{"id": 7, "image_id": 1, "category_id": 1,
                                                     "segmentation": {"size": [9000, 9000], "counts": "0"}}],
                                    "categories": categories}))
    sbd = tmp_path / "2008_000002.mat"
    scipy.io.savemat(sbd, {"GTcls": {"Segmentation": np.zeros((9000, 9000), np.uint8)}}, do_compression=True)
    assert sbd.stat().st_size < 100_000

    calls = {f"load_image(Path({str(iptc)!r}))": iptc, f"load_index_png(Path({str(iptc)!r}), max_value=20, what='x')": iptc,
             f"load_image(Path({str(eps)!r}), formats=PREDICT_FORMATS)": eps,
             f"load_instances(Path({str(huge_image)!r}))": huge_image, f"load_instances(Path({str(huge_rle)!r}))": huge_rle,
             f"read_sbd_mat(Path({str(sbd)!r}))": sbd}
    small = tmp_path / "small.png"
    Image.new("RGB", (64, 64)).save(small)
    results = probe("from pathlib import Path\n"
                    "from npsemiseg.data.datasets import load_image, load_index_png\n"
                    "from npsemiseg.data.prepare import read_sbd_mat\n"
                    "from npsemiseg.data.prepare_coco import load_instances\n"
                    "from npsemiseg.untrusted import PREDICT_FORMATS\n"
                    f"load_image(Path({str(small)!r}))",  # warm-up: a real image
                    list(calls))
    assert_refused(results, {call: str(path) for call, path in calls.items()})
    assert "is not a JPEG / PNG image" in results[0]["error"] and "is not a PNG image" in results[1]["error"]
    assert "not a JPEG / PNG / BMP / TIFF / WEBP image" in results[2]["error"]
    assert "9000 x 9000" in results[3]["error"] and "RLE size [9000, 9000]" in results[4]["error"]


# ----------------------------------------------------------------------------- 3. parses
def alias_bomb(levels: int = 9) -> str:
    """YAML of ~300 bytes standing for 10^levels values."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_yaml_and_specs_are_parsed_within_a_budget(tmp_path, monkeypatch):
    config = tmp_path / "bomb.yaml"
    config.write_text(alias_bomb())
    deep = tmp_path / "deep.yaml"
    deep.write_text("seed: " + "[" * 5000 + "]" * 5000 + "\n")
    exported = tmp_path / "model.pt"
    torch.save({"kind": "npsemiseg.model", "format": 1, "config": alias_bomb(), "step": 0, "state": {}}, exported)
    folder = tmp_path / "data" / "roads"
    folder.mkdir(parents=True)
    (folder / "classes.yaml").write_text("names: &n [road, car]\n" + alias_bomb().replace("l", "k"))
    grid = tmp_path / "grid.yaml"
    grid.write_text("name: huge\npreset: smoke\nframeworks: [supervised]\ndatasets: {pascal_classic: all}\n"
                    "heads: [baseline]\nseeds: [" + ", ".join(str(i) for i in range(2000)) + "]\n")

    calls = {f"RunConfig.from_yaml(Path({str(config)!r}))": config, f"RunConfig.from_yaml(Path({str(deep)!r}))": deep,
             f"npsemiseg.load_model({str(exported)!r})": exported,
             f"read_classes(Path({str(folder)!r}))": folder / "classes.yaml",
             f"load_spec(Path({str(grid)!r}))": grid, f"load_search_spec(Path({str(config)!r}))": config}
    results = probe("from pathlib import Path\nimport npsemiseg\nfrom npsemiseg.config import RunConfig\n"
                    "from npsemiseg.data.sets.folder import read_classes\n"
                    "from semiseg_platform.sweeps.grid_spec import load_spec\n"
                    "from semiseg_platform.sweeps.search_spec import load_search_spec\n"
                    "npsemiseg.untrusted.load_yaml('seed: 1', where='warm-up')\n"
                    "npsemiseg.load_model  # its modules (torch) imported here, not in the measured call", list(calls))
    assert_refused(results, {call: str(path) for call, path in calls.items()})
    assert "more than 100,000 values once its aliases are expanded" in results[0]["error"]
    assert "nest" in results[1]["error"]
    assert "8,000 combinations" in results[4]["error"] and "max_cells (1,000)" in results[4]["error"]

    # the budget refuses nothing the project's own configurations and specs use: merge keys included
    from npsemiseg.untrusted import load_yaml
    from semiseg_platform.sweeps.grid_spec import load_spec

    assert load_yaml("base: &b {x: 1}\nother: {<<: *b, y: 2}\n", where="t") == {"base": {"x": 1}, "other": {"x": 1, "y": 2}}
    assert load_spec({**load_yaml(grid.read_text(), where="t"), "max_cells": 8000}).max_cells == 8000  # raised

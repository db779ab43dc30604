"""The evaluation under shift: seeded corrupted copies, their cache, the configuration and a run end to end."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from benchmark_scripts import load_benchmark
from torch.utils.data import Dataset

from npsemiseg.config import cell_config
from npsemiseg.constants import CORRUPTION_SEVERITIES, CORRUPTIONS
from npsemiseg.data import build_dataset
from npsemiseg.evaluation.corruptions import (
    COPY_RECORD,
    build_copy,
    corrupt_image,
    corrupted_copy,
    corruption_table,
    image_file,
    image_seed,
    summarize_shift,
    write_corrupted,
)
from npsemiseg.training.factories import build_model


def _val(size: int = 32, count: int = 4) -> Dataset:
    return build_dataset("synthetic", "val", image_size=size, val_size=count)


def _test_image() -> np.ndarray:
    """120 px of gradients and 13 px checks: edges every blur smooths more with severity, no scale aligned."""
    y, x = np.mgrid[0:120, 0:120]
    return np.stack([x * 2, (y * y) // 60, ((x // 13 + y // 13) % 2) * 200 + 28], -1).astype(np.uint8)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_every_corruption_has_five_severities_of_one_albumentations_transform():
    import albumentations

    table = corruption_table()
    assert tuple(table) == CORRUPTIONS
    for name, (transform, severities) in table.items():
        assert hasattr(albumentations, transform), name
        assert len(severities) == len(CORRUPTION_SEVERITIES), name


@pytest.mark.parametrize("corruption", ["gaussian_noise", "impulse_noise", "snow", "glass_blur", "fog"])
def test_a_copy_is_bitwise_the_same_whatever_the_order_it_is_built_in(tmp_path, corruption):
    val = _val()
    forward = build_copy(val, tmp_path / "forward", corruption, 3, data_seed=7, num_images=4)
    backward = tmp_path / "backward"
    backward.mkdir()
    for index in reversed(range(4)):
        write_corrupted(val, backward, index, corruption, 3, data_seed=7)
    images = {k: v for k, v in _files(forward).items() if k != COPY_RECORD}
    assert images == _files(backward)
    rebuilt = build_copy(val, tmp_path / "again", corruption, 3, data_seed=7, num_images=4)
    assert _files(rebuilt) == _files(forward)
    other_seed = build_copy(val, tmp_path / "seed8", corruption, 3, data_seed=8, num_images=4)
    assert _files(other_seed)[image_file(other_seed, 0).name] != images[image_file(forward, 0).name]


def test_an_images_seed_depends_on_every_key():
    seeds = {image_seed(*keys) for keys in [(0, "fog", 1, 0), (1, "fog", 1, 0), (0, "snow", 1, 0),
                                            (0, "fog", 2, 0), (0, "fog", 1, 1)]}
    assert len(seeds) == 5
    assert image_seed(0, "fog", 1, 0) == image_seed(0, "fog", 1, 0)


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_higher_severity_corrupts_more(corruption):
    """PSNR against the clean image falls with the severity (pixelate: the image keeps fewer distinct columns,
    its resolution; its PSNR is not monotone where a scale divides the image's period)."""
    image = _test_image()
    measures = []
    for severity in CORRUPTION_SEVERITIES:
        outs = [corrupt_image(image, corruption, severity, seed=seed) for seed in range(3)]
        if corruption == "pixelate":
            measures.append(np.mean([np.unique(out, axis=1).shape[1] for out in outs]))
        else:
            mse = np.mean([((out.astype(float) - image) ** 2).mean() for out in outs])
            measures.append(10 * math.log10(255**2 / mse))
    assert all(np.diff(measures) < 0), measures


def test_a_built_copy_is_read_not_rebuilt(tmp_path):
    val = _val()
    first = corrupted_copy(val, "gaussian_noise", 2, data_seed=0, key="synthetic-val", cache_dir=tmp_path)
    black = np.zeros((32, 32, 3), dtype=np.uint8)
    Image.fromarray(black).save(image_file(first.directory, 1))  # a rebuild would overwrite this
    second = corrupted_copy(val, "gaussian_noise", 2, data_seed=0, key="synthetic-val", cache_dir=tmp_path)
    assert second.directory == first.directory
    assert torch.count_nonzero(second[1]["image"]) == 0
    assert torch.equal(second[1]["label"], val[1]["label"])
    assert second[0]["image"].shape == val[0]["image"].shape and second[0]["image"].dtype == torch.float32


class _FailsAt(Dataset):
    """``source`` whose item ``index`` raises, as a read error mid-build would."""

    def __init__(self, source: Dataset, index: int) -> None:
        self.source, self.index = source, index

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        if index == self.index:
            raise OSError(f"item {index} unreadable")
        return self.source[index]


def test_a_build_that_fails_leaves_no_folder_and_a_later_one_completes(tmp_path):
    directory = tmp_path / "copy"
    with pytest.raises(OSError, match="item 2 unreadable"):
        build_copy(_FailsAt(_val(), 2), directory, "fog", 1, data_seed=0, num_images=4)
    assert list(tmp_path.iterdir()) == []
    build_copy(_val(), directory, "fog", 1, data_seed=0, num_images=4)
    assert sorted(p.name for p in directory.iterdir()) == [*(f"{i:06d}.png" for i in range(4)), COPY_RECORD]


_KILLED_BUILD = """
import sys
from pathlib import Path
from npsemiseg.data import build_dataset
from npsemiseg.evaluation.corruptions import build_copy
val = build_dataset("synthetic", "val", image_size=128, val_size=400)
build_copy(val, Path(sys.argv[1]), "glass_blur", 5, data_seed=0, num_images=400)
"""


def test_a_killed_build_leaves_no_copy_that_a_later_build_reads(tmp_path):
    directory = tmp_path / "copy"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, str(directory)], env=env)
    try:
        while not any(tmp_path.glob(".copy.building-*/000001.png")):
            assert process.poll() is None, "the build ended before it was killed"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert not directory.exists()
    build_copy(_val(), directory, "glass_blur", 5, data_seed=0, num_images=2)
    assert (directory / COPY_RECORD).is_file() and len(list(directory.glob("*.png"))) == 2


def test_an_unknown_corruption_is_refused_by_name_with_the_allowed_ones():
    with pytest.raises(ValueError, match="frost") as error:
        cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                    **{"evaluation.corruptions": ["fog", "frost"]})
    assert "gaussian_noise" in str(error.value) and "pixelate" in str(error.value)
    with pytest.raises(ValueError, match="corruption_severities"):
        cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                    **{"evaluation.corruption_severities": [0, 6]})
    with pytest.raises(ValueError, match="'frost'.*gaussian_noise"):
        corrupt_image(_test_image(), "frost", 1, seed=0)


def test_the_paper_preset_evaluates_under_shift_and_smoke_does_not():
    cell = dict(framework="u2pl", dataset="pascal_classic", partition="1/16", head="np")
    assert cell_config("paper", **cell).evaluation.corruptions == CORRUPTIONS
    assert cell_config("smoke", **cell).evaluation.corruptions == ()
    # evaluation-only: the cell's id does not change with it
    shifted = cell_config("smoke", **cell, **{"evaluation.corruptions": ["fog"]})
    assert shifted.cell_id == cell_config("smoke", **cell).cell_id


def test_summary_is_the_mean_over_corruptions_and_severities():
    per_copy = {("fog", 1): {"miou": 0.5, "ece": 0.1, "iou/a": 0.3, "num_images": 2.0},
                ("fog", 3): {"miou": 0.3, "ece": 0.2, "iou/a": 0.3, "num_images": 2.0},
                ("snow", 1): {"miou": 0.4, "ece": 0.3, "iou/a": 0.3, "num_images": 2.0},
                ("snow", 3): {"miou": 0.2, "ece": 0.6, "iou/a": 0.3, "num_images": 2.0}}
    summary = summarize_shift(per_copy)
    assert summary["shift/fog/3/miou"] == 0.3 and "shift/fog/3/iou/a" not in summary
    assert summary["shift/fog/mean/miou"] == pytest.approx(0.4)
    assert summary["shift/snow/mean/ece"] == pytest.approx(0.45)
    assert summary["shift/mean/miou"] == pytest.approx(0.35)
    assert summary["shift/mean/error"] == pytest.approx(0.65)
    assert summary["shift/mean/ece"] == pytest.approx(0.3)


def test_a_run_evaluates_its_weights_under_shift(tmp_path, monkeypatch):
    """A smoke cell on the synthetic data with two corruptions at two severities: every copy's metrics, the
    means, and copy (severity 5 of contrast) mIoU differing from clean, from copies in the cache folder."""
    from npsemiseg.training import train

    monkeypatch.setenv("NPSEMISEG_CACHE", str(tmp_path))
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="np",
                         **{"runtime.device": "cpu", "evaluation.corruptions": ["gaussian_noise", "contrast"],
                            "evaluation.corruption_severities": [1, 5]})
    metrics = train(config).metrics
    copies = [(c, s) for c in ("gaussian_noise", "contrast") for s in (1, 5)]
    for corruption, severity in copies:
        for metric in ("miou", "ece", "auroc", "nll", "brier", "pavpu"):
            assert math.isfinite(metrics[f"shift/{corruption}/{severity}/{metric}"]) or metric == "auroc"
    assert metrics["shift/mean/miou"] == pytest.approx(np.mean([metrics[f"shift/{c}/{s}/miou"] for c, s in copies]))
    assert metrics["shift/mean/error"] == pytest.approx(1 - metrics["shift/mean/miou"])
    built = sorted(p.relative_to(tmp_path).parts[3:5] for p in tmp_path.glob("corruptions/*/*/*/*/seed0"))
    assert built == sorted((c, f"severity{s}") for c, s in copies)
    assert all(len(list(p.glob("*.png"))) == 2 for p in tmp_path.glob("corruptions/*/*/*/*/seed0"))


def test_the_cost_benchmark_builds_and_evaluates_a_copy(tmp_path):
    benchmark = load_benchmark("corruption_cost")
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                         **{"runtime.device": "cpu"})
    row = benchmark.measure("fog", _val(), build_model(config), config, severity=2, images=2, cache=tmp_path)
    assert set(row) == {"build_s_per_image", "evaluate_s_per_copy", "miou"} and 0.0 <= row["miou"] <= 1.0
    assert [len(list(p.glob("*.png"))) for p in tmp_path.glob("*/*/fog/severity2/seed0")] == [2]

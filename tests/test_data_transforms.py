"""Joint transforms: alignment of image and label, padding values, crop sizes, strong views."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from npsemiseg.data import build_dataset
from npsemiseg.data.transforms import (
    AUGSEG_OPS,
    IMAGENET_MEAN,
    RandomIntensityAugment,
    RandomLongSideResize,
    RandomRescale,
    SegmentationTransform,
    paper_augmentation,
    strong_pipeline,
    train_transform,
    val_transform,
    weak_pipeline,
)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def encoded_item(height: int, width: int, block: int = 6, seed: int = 0) -> dict:
    """An item whose image encodes its label: channel 0 = 10 * label / 255 (labels 0..20, blocky)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, 21, (-(-height // block), -(-width // block)), generator=g)
    label = coarse.repeat_interleave(block, 0).repeat_interleave(block, 1)[:height, :width].contiguous()
    image = torch.rand(3, height, width, generator=g)
    image[0] = label.float() * 10 / 255
    return {"image": image, "label": label, "id": "encoded"}


def decode(image: torch.Tensor) -> torch.Tensor:
    return torch.round(image[0] * 255 / 10).long()


def uniform_interior(label: torch.Tensor) -> torch.Tensor:
    """Pixels whose 3x3 neighbourhood has one label (away from block edges, padding and the crop border)."""
    padded = torch.nn.functional.pad(label[None, None].float(), (1, 1, 1, 1), value=-1.0)
    patches = torch.nn.functional.unfold(padded, 3).view(9, *label.shape)
    return (patches == patches[4:5]).all(0)


@pytest.mark.parametrize("resize", ["none", "rescale", "rescale_balanced", "long_side"])
def test_weak_pipeline_keeps_image_and_label_aligned(resize):
    transform = train_transform(32, resize=resize, base_size=40)
    for seed in range(12):
        torch.manual_seed(seed)
        out = transform(encoded_item(36, 44, seed=seed))
        label, image = out["label"], out["image"]
        assert label.shape == (32, 32) and image.shape == (3, 32, 32)
        inside = uniform_interior(label) & (label != 255)
        assert int(inside.sum()) > 30
        if resize == "none":
            assert torch.equal(decode(image)[label != 255], label[label != 255])
        else:
            assert torch.equal(decode(image)[inside], label[inside])


def test_flip_moves_image_and_label_together():
    item = encoded_item(32, 32, block=4)
    transform = train_transform(32, resize="none")
    flips = 0
    for seed in range(10):
        torch.manual_seed(seed)
        out = transform(item)
        assert torch.equal(decode(out["image"]), out["label"])
        flipped = torch.equal(out["label"], item["label"].flip(-1))
        assert flipped or torch.equal(out["label"], item["label"])
        flips += flipped
    assert 0 < flips < 10


@pytest.mark.parametrize("label_pad_value", [255, 0])
def test_crop_pads_image_with_the_mean_and_label_with_255(label_pad_value):
    item = encoded_item(20, 20)
    out = train_transform(32, resize="none", flip=False, label_pad_value=label_pad_value)(item)
    # 12 rows/columns of padding, split evenly: 6 before, 6 after
    pad = torch.ones(32, 32, dtype=torch.bool)
    pad[6:26, 6:26] = False
    assert bool((out["label"][pad] == label_pad_value).all())
    assert torch.equal(out["label"][6:26, 6:26], item["label"])
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1)
    assert torch.allclose(out["image"][:, pad], mean.expand(3, int(pad.sum())))
    assert torch.equal(out["image"][:, 6:26, 6:26], item["image"])


@pytest.mark.parametrize("size,crop", [((50, 30), 32), ((20, 70), (16, 24)), ((16, 24), (16, 24))])
def test_crop_sizes(size, crop):
    expected = (crop, crop) if isinstance(crop, int) else crop
    for seed in range(5):
        torch.manual_seed(seed)
        out = train_transform(crop)(encoded_item(*size))
        assert out["label"].shape == expected and out["image"].shape == (3, *expected)


def test_rescale_ranges():
    flat = [torch.zeros(3, 100, 60)]
    torch.manual_seed(0)
    balanced = [RandomRescale((0.5, 2.0), balanced=True).make_params(flat)["size"] for _ in range(200)]
    scales = torch.tensor([h / 100 for h, _ in balanced])
    assert float(scales.min()) >= 0.5 and float(scales.max()) <= 2.0
    assert 60 < int((scales < 1).sum()) < 140  # U[0.5, 1] or U[1, 2] with probability 1/2 each
    assert all(abs(w / h - 0.6) < 0.02 for h, w in balanced)
    uniform = torch.tensor([RandomRescale((0.5, 2.0)).make_params(flat)["size"][0] / 100 for _ in range(200)])
    assert int((uniform < 1).sum()) < 100  # U[0.5, 2]: a third below 1
    scales = (0.5, 0.75, 1.0, 1.5, 1.75, 2.0)  # TorchSemiSeg's train_scale_array, one drawn per image
    chosen = [RandomRescale(resample="interpolate", choices=scales).make_params(flat)["size"] for _ in range(600)]
    counts = {scale: sum(size == [int(100 * scale), int(60 * scale)] for size in chosen) for scale in scales}
    assert sum(counts.values()) == 600 and all(70 < n < 130 for n in counts.values()), counts
    balanced_choice = RandomRescale(balanced=True, choices=scales)  # the choices replace either mode's draw
    assert all(size[0] in (50, 75, 100, 150, 175, 200) for size in (balanced_choice.make_params(flat)["size"]
                                                                    for _ in range(50)))
    with pytest.raises(ValueError, match="scale_choices: expected a non-empty list of positive scales"):
        RandomRescale(choices=[0.5, 0.0])
    sides = [RandomLongSideResize(25, 100).make_params(flat)["size"] for _ in range(100)]
    assert all(25 <= max(s) <= 100 and abs(s[1] / s[0] - 0.6) < 0.03 for s in sides)
    with pytest.raises(ValueError, match="base_size"):
        weak_pipeline(32, resize="long_side")
    with pytest.raises(ValueError, match="resize must be one of"):
        weak_pipeline(32, resize="jitter")


@pytest.mark.parametrize("strong", ["augseg", "psmt"])
def test_strong_view_is_a_photometric_change_of_the_weak_crop(strong):
    item = encoded_item(40, 40)
    changed = 0
    for seed in range(8):
        torch.manual_seed(seed)
        weak_only = train_transform(32)(item)
        torch.manual_seed(seed)
        out = train_transform(32, strong=strong)(item)
        assert torch.equal(out["image"], weak_only["image"]) and torch.equal(out["label"], weak_only["label"])
        assert out["image_strong"].shape == out["image"].shape
        assert 0 <= float(out["image_strong"].min()) and float(out["image_strong"].max()) <= 1
        changed += not torch.allclose(out["image_strong"], out["image"])
    assert changed >= 4


def test_blur_sigma_range_of_both_strong_views():
    augseg = train_transform(32, strong="augseg", blur_sigma=(0.02, 0.03)).strong
    psmt = train_transform(32, strong="psmt", blur_sigma=(0.02, 0.03)).strong.transforms[-1]
    blur_only = RandomIntensityAugment(num_ops=(1, 1), ops=["blur"], blur_sigma=(0.02, 0.03))
    for seed in range(20):
        torch.manual_seed(seed)
        (name, sigma), = blur_only.make_params([])["ops"]
        assert name == "blur" and 0.02 <= sigma <= 0.03
        drawn = psmt.make_params([])["sigma"]
        assert drawn is None or 0.02 <= drawn <= 0.03
    assert augseg.blur_sigma == (0.02, 0.03)
    # the papers' range [0.1, 2] by default, drawn as 0.1 + 1.9 u from one uniform u after the op choice
    torch.manual_seed(0)
    default = RandomIntensityAugment(num_ops=(1, 1), ops=["blur"]).make_params([])["ops"][0][1]
    torch.manual_seed(0)
    torch.randint(1, 2, ()), torch.randint(0, 1, (1,))
    assert default == pytest.approx(0.1 + float(torch.rand(())) * 1.9)
    with pytest.raises(ValueError, match="blur_sigma"):
        train_transform(32, strong="psmt", blur_sigma=(0.5, 0.1))


def test_identity_strong_view_is_the_weak_crop():
    item = encoded_item(40, 40)
    for seed in range(3):
        torch.manual_seed(seed)
        out = train_transform(32, strong="identity")(item)
        assert torch.equal(out["image_strong"], out["image"])
    with pytest.raises(ValueError, match="strong kind must be one of"):
        train_transform(32, strong="cutout")


def test_psmt_strong_includes_grayscale():
    torch.manual_seed(0)
    grey = 0
    image = torch.rand(3, 16, 16)
    for _ in range(40):
        out = strong_pipeline("psmt")(image)
        grey += bool(torch.allclose(out[0], out[1]) and torch.allclose(out[1], out[2]))
    assert 2 <= grey <= 20  # p = 0.2


def test_augseg_operations():
    assert set(AUGSEG_OPS) == {"identity", "autocontrast", "equalize", "blur", "contrast", "brightness",
                               "color", "sharpness", "posterize", "solarize", "hue"}
    torch.manual_seed(0)
    image = torch.rand(3, 16, 16) * 0.5 + 0.25
    for name, (strength, op) in AUGSEG_OPS.items():
        out = op(image, strength())
        assert out.shape == image.shape and out.dtype == torch.float32
        assert 0 <= float(out.min()) and float(out.max()) <= 1, name
    assert torch.equal(AUGSEG_OPS["identity"][1](image, None), image)
    augment = RandomIntensityAugment()
    counts = [len(augment.make_params([image])["ops"]) for _ in range(300)]
    assert set(counts) == {1, 2, 3}
    brightness = RandomIntensityAugment(num_ops=(1, 1), ops=["brightness"])
    assert float(brightness(image).mean()) < float(image.mean())  # factor in [0.05, 0.95] darkens
    with pytest.raises(ValueError, match="unknown"):
        RandomIntensityAugment(ops=["cutout"])


def test_val_transform_center_crop_and_whole_image():
    item = encoded_item(20, 50)
    out = val_transform(32)(item)
    assert out["label"].shape == (32, 32)
    assert torch.equal(out["label"][6:26], item["label"][:, 9:41])
    assert bool((out["label"][:6] == 255).all())
    whole = val_transform()(item)
    assert torch.equal(whole["image"], item["image"]) and torch.equal(whole["label"], item["label"])
    assert type(whole["image"]) is torch.Tensor


def test_pipelines_are_deterministic_in_a_seeded_dataloader():
    transform = train_transform(24, strong="augseg")
    ds = build_dataset("synthetic", "unlabeled", partition="1/4", image_size=32, train_size=32, transform=transform)

    def batches():
        loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(7))
        return [b for _, b in zip(range(2), loader)]

    first, second = batches(), batches()
    for a, b in zip(first, second):
        assert a["id"] == b["id"]
        for key in ("image", "image_strong", "label"):
            assert torch.equal(a[key], b[key])
    assert first[0]["image_strong"].shape == (4, 3, 24, 24)


def test_paper_augmentation_settings():
    assert paper_augmentation("u2pl", "voc") == {"resize": "rescale_balanced", "strong": None}
    assert paper_augmentation("augseg", "voc") == {"resize": "long_side", "base_size": 500, "strong": "augseg"}
    assert paper_augmentation("psmt", "cityscapes") == {"resize": "rescale", "strong": "psmt"}
    out = train_transform(16, **paper_augmentation("psmt", "voc"))(encoded_item(30, 40))
    assert "image_strong" in out
    with pytest.raises(ValueError, match="framework"):
        paper_augmentation("fixmatch", "voc")
    assert isinstance(train_transform(8), SegmentationTransform)


#: what AugSeg@7ead870's ``augseg/dataset/augs_TIBA.py`` (163-259) calls for each operation at strength v, on a
#: PIL image: Pillow's own functions, so that the project's tensor operations are checked against the library the
#: official views are made with (the hue shift is its HSV round trip, the shift cast to uint8 as NumPy 1 wrapped it)
def _hue_as_augseg(image, v):
    import numpy as np
    from PIL import Image

    h, s, value = image.convert("HSV").split()
    hue = np.array(h, dtype=np.uint8) + np.uint8(int(v * 255) % 256)
    return Image.merge("HSV", (Image.fromarray(hue, "L"), s, value)).convert("RGB")


def _pillow_operations():
    from PIL import ImageEnhance, ImageFilter, ImageOps

    return {"autocontrast": lambda im, v: ImageOps.autocontrast(im),
            "equalize": lambda im, v: ImageOps.equalize(im),
            "blur": lambda im, v: im.filter(ImageFilter.GaussianBlur(radius=v)),
            "contrast": lambda im, v: ImageEnhance.Contrast(im).enhance(v),
            "brightness": lambda im, v: ImageEnhance.Brightness(im).enhance(v),
            "color": lambda im, v: ImageEnhance.Color(im).enhance(v),
            "sharpness": lambda im, v: ImageEnhance.Sharpness(im).enhance(v),
            "posterize": lambda im, v: ImageOps.posterize(im, v),
            "solarize": lambda im, v: ImageOps.solarize(im, round(v * 255)),
            "hue": _hue_as_augseg}


@pytest.mark.parametrize(("name", "strengths", "mean_levels"), [
    ("autocontrast", [None], 1.0), ("equalize", [None], 0.0), ("contrast", [0.05, 0.5, 0.95], 1.0),
    ("brightness", [0.05, 0.5, 0.95], 1.0), ("color", [0.05, 0.5, 0.95], 1.0), ("sharpness", [0.05, 0.5, 0.95], 1.0),
    ("posterize", [4, 5, 6, 7], 1.0), ("solarize", [1 / 255, 64 / 255, 200 / 255], 0.0),
    # Pillow's hue is 256 steps of HSV in uint8 (a pixel may move up to ~13 levels), its blur three box filters
    ("hue", [-0.3, -0.1, 0.1, 0.3, 0.5], 1.5), ("blur", [0.1, 0.5, 1.0, 2.0], 1.5)])
def test_augseg_operations_equal_the_pillow_operations_augseg_applies(name, strengths, mean_levels):
    """Each of AugSeg's intensity operations, on the study's images at the same strength, equals what Pillow gives
    (AugSeg makes its strong views with Pillow on uint8 images): the mean difference within ``mean_levels`` of 255
    (Pillow rounds to uint8 after every operation, the project stays in float), plus one level of rounding."""
    import numpy as np
    from PIL import Image

    from npsemiseg.data.study import StudyConfig, generate

    config = StudyConfig.from_options("study", family="study_textures", seed=0)
    images = [(generate(config, "train", i)[0] * 255).round().to(torch.uint8) for i in range(6)]
    pillow = _pillow_operations()[name]
    for v in strengths:
        for image in images:
            expected = np.asarray(pillow(Image.fromarray(image.permute(1, 2, 0).numpy()), v), dtype=np.float64)
            got = (AUGSEG_OPS[name][1](image.float() / 255, v).clamp(0, 1) * 255).permute(1, 2, 0).double().numpy()
            assert np.abs(expected - got).mean() <= mean_levels + 1.0, (name, v)

"""The study and the project's side of the official runs: the settings of a run (the mini study's, the official
pipelines', the regime's), the export of the study data in the official layouts and their list files, the official
epoch (the unlabeled pool), UniMatch's config of a cell, and the project's cell run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image
from torch import Tensor

from npsemiseg.config import RunConfig, compose
from npsemiseg.data.study import StudyConfig, generate, labeled_indices, partition_counts
from npsemiseg.frameworks import get_framework
from npsemiseg.short_run import RunLength, scale_time_settings
from npsemiseg.training import train

ROOT = Path(__file__).resolve().parents[2]
MINI_SPEC = ROOT / "jobs" / "specs" / "mini.yaml"
#: the mini study's ViT rows (UniMatch V2 and its supervised reference): the network and settings of the V2 frameworks
MINI_VIT_SPEC = ROOT / "jobs" / "specs" / "mini_vit.yaml"
PARTITION = "1/16"
DATASET = "study"
#: the prefix of a dataset-instance option among the overrides (``data.options.image_size``)
DATA_OPTION = "data.options."
SIDES = ("official", "project")
#: framework -> (official repository, training script)
OFFICIAL = {"supervised": ("LiheYoung/UniMatch", "supervised.py"), "fixmatch": ("LiheYoung/UniMatch", "fixmatch.py"),
            "unimatch": ("LiheYoung/UniMatch", "unimatch.py"), "u2pl": ("Haochen-Wang409/U2PL", "train_semi.py"),
            "augseg": ("ZhenZHAO/AugSeg", "train_semi.py"),
            "unimatch_v2": ("LiheYoung/UniMatch-V2", "unimatch_v2.py"),
            "fixmatch_v2": ("LiheYoung/UniMatch-V2", "fixmatch.py"),
            "supervised_v2": ("LiheYoung/UniMatch-V2", "supervised.py"),
            "psmt": ("yyliu01/PS-MT", "VocCode/main.py"),
            "mt_cps": ("charlesCXK/TorchSemiSeg", "exp.voc/voc8.res50v3+.MeanTeacher/train.py"),
            "supervised_u2pl": ("Haochen-Wang409/U2PL", "train_sup.py"),
            "np_u2pl": ("Jianf-Wang/NP-SemiSeg", "U2PL/train_semi.py"),
            "np_augseg": ("Jianf-Wang/NP-SemiSeg", "AugSeg/train_semi.py")}
#: UniMatch V2's frameworks, on the mini study's ViT (``jobs/specs/mini_vit.yaml``)
V2 = ("unimatch_v2", "fixmatch_v2", "supervised_v2")
#: the supervised references: UniMatch's ``supervised.py`` (the DeepLabv3+ frameworks' on UniMatch's network, the
#: AugSeg decoder variant: UniMatch's, FixMatch's, AugSeg's and PS-MT's), UniMatch V2's (the ViT's), U2PL's
#: ``train_sup.py`` (U2PL's network, the U2PL decoder: U2PL's, the NP-SemiSeg authors' U2PL's and MT-CPS's, whose
#: released network is the same but for its train-time dropout, which TorchSemiSeg's has not)
SUPERVISED = {"supervised": "supervised", "unimatch_v2": "supervised_v2", "fixmatch_v2": "supervised_v2",
              "supervised_v2": "supervised_v2", "u2pl": "supervised_u2pl", "mt_cps": "supervised_u2pl",
              "supervised_u2pl": "supervised_u2pl", "np_u2pl": "supervised_u2pl"}
#: a framework's name in the project's registry where it differs (supervised on the ViT is the project's
#: ``supervised``, as ``mini_vit.yaml``'s ``supervised_unimatch_v2``)
#: ``mt_cps``: the mini study's ``mt`` cell, which runs framework ``mt_cps`` under ``released`` (switch ``mt_framework``)
PROJECT_FRAMEWORK = {"supervised_v2": "supervised", "mt_cps": "mt", "supervised_u2pl": "supervised", "np_u2pl": "u2pl",
                     "np_augseg": "augseg"}
#: the head of a framework's cell where it is not the baseline: the NP-SemiSeg authors' scripts are U2PL's and
#: AugSeg's with the NP head
HEAD = {"np_u2pl": "np", "np_augseg": "np"}
#: the NP cells' evaluation as the authors' training scripts evaluate every epoch: the mean of the logits of T = 5
#: latent samples (``validate``: ``outs['pred'].mean(0)``, the head's ``forward_times=5``), where ``released`` takes
#: ``U2PL/eval.py``'s T = 20 (switch ``np_eval_samples``)
NP_EVALUATION = {"evaluation.num_samples": 5}
#: the official pipeline's settings the mini study changes (``resize: none``, a blur scaled to 64 px): back to the
#: official code's, on the project's side too (UniMatch: long side in [0.5, 2] x the image's, blur sigma in [0.1, 2]),
#: and UniMatch's crop: padded at the bottom and right with black (the released UniMatch family's switches
#: ``crop_padding`` and ``crop_fill``, set here for the supervised reference too, whose project framework they do not
#: cover; the project's side padded with the ImageNet mean before 2026-11-29)
OFFICIAL_PIPELINE = {"data.augmentation.resize": "long_side", "data.augmentation.base_size": 64,
                     "data.augmentation.blur_sigma": [0.1, 2.0], "data.augmentation.crop_padding": "bottom_right",
                     "data.augmentation.crop_fill": "zero"}
#: U2PL's (``rand_resize: [0.5, 2.0]``: a scale of the image, nothing to scale to 64 px, resampled as its
#: ``RandResize``: bilinear without antialiasing, the label's legacy nearest, the size floored; padded on both sides,
#: the label with 0; what switches ``u2pl_resize`` and ``u2pl_label_pad`` give the released U2PL cells, set here for
#: ``train_sup.py``'s supervised side too, whose framework they do not cover (before 2026-11-29 its labels were padded
#: with 255 and it resampled as PIL); no blur: U2PL has no strong view)
U2PL_PIPELINE = {"data.augmentation.resize": "rescale_balanced", "data.augmentation.scale_range": [0.5, 2.0],
                 "data.augmentation.crop_padding": "centered", "data.augmentation.resize_resample": "interpolate",
                 "data.augmentation.label_pad_value": 0}
#: AugSeg's is UniMatch's (``Resize``: the long side a random integer in [0.5, 2] x ``resize_base_size``, the image's
#: 64 here as VOC's 500; padded at the bottom and right; its strong views' blur sigma in [0.1, 2]) but for the crop's
#: image fill: the ImageNet mean (``augs_TIBA.py`` ``Crop``)
AUGSEG_PIPELINE = {**OFFICIAL_PIPELINE, "data.augmentation.crop_fill": "mean"}
#: PS-MT's is AugSeg's (``Base/base_dataset.py``: the long side a random integer in [0.5, 2] x ``base_size``, a crop
#: padded at the bottom and right with the mean and 255, flip; its strong view's blur sigma in [0.1, 2]) with its
#: ``base_size`` 600 for VOC's 500 px images (:data:`BASE_SIZE_PER_IMAGE`)
PSMT_PIPELINE = AUGSEG_PIPELINE
#: TorchSemiSeg MeanTeacher's (``dataloader.py`` ``TrainPre``: flip, a scale of the image drawn from config.py's
#: ``train_scale_array`` [0.5, 0.75, 1, 1.5, 1.75, 2], normalised, a random crop padded on both sides with 0 after
#: normalisation, the mean, and the label with 255; no strong view): the rescale of the released MT cell (switches
#: ``mt_cps_scales`` and ``mt_cps_resize`` since 2026-11-30: the six scales, OpenCV's resampling; before, a scale in
#: U[0.5, 2], antialiased), its crop padded on both sides
MT_CPS_PIPELINE = {"data.augmentation.resize": "rescale", "data.augmentation.scale_range": [0.5, 2.0],
                   "data.augmentation.crop_padding": "centered", "data.augmentation.crop_fill": "mean",
                   "data.augmentation.label_pad_value": 255}
OFFICIAL_PIPELINES = {"supervised": OFFICIAL_PIPELINE, "fixmatch": OFFICIAL_PIPELINE, "unimatch": OFFICIAL_PIPELINE,
                      "u2pl": U2PL_PIPELINE, "augseg": AUGSEG_PIPELINE, "psmt": PSMT_PIPELINE, "mt_cps": MT_CPS_PIPELINE,
                      "supervised_u2pl": U2PL_PIPELINE, "np_u2pl": U2PL_PIPELINE, "np_augseg": AUGSEG_PIPELINE,
                      **dict.fromkeys(V2, OFFICIAL_PIPELINE)}
#: the official resize's base size per image size where it is not the image's (VOC's images are 500 px): PS-MT's
#: ``base_size`` 600 (``configs/config_deeplab_v3+.json``)
BASE_SIZE_PER_IMAGE = {"psmt": 600 / 500}
#: the export's layouts: label folder, list folder, one list line of item ``name`` (``u2pl``: also AugSeg's)
LAYOUTS = {"unimatch": ("SegmentationClass", f"splits/{DATASET}", "JPEGImages/{name}.jpg SegmentationClass/{name}.png"),
           "u2pl": ("SegmentationClassAug", f"splits/pascal_{DATASET}", "{name}"),
           "pascal": ("SegmentationClass", "splits/pascal", "JPEGImages/{name}.jpg SegmentationClass/{name}.png"),
           "psmt": ("SegmentationClassAug", "VocCode/DataLoader/voc_splits",
                    "/JPEGImages/{name}.jpg /SegmentationClassAug/{name}.png"),
           "torchsemiseg": ("label", "", "{name}")}
#: a layout's list files where they are not ``<partition>/labeled.txt``, ``<partition>/unlabeled.txt`` and
#: ``val.txt`` under its list folder (PS-MT: ``<n labeled>_train_supervised.txt``, ``DataLoader/voc.py`` 40-46)
#: TorchSemiSeg: config.py's ``subset_train_aug/train_aug_labeled_1-<ratio>.txt``, ``..._unlabeled_...`` and ``val.txt``
LIST_FILES = {"psmt": {"labeled": "{labeled}_train_supervised.txt", "unlabeled": "{labeled}_train_unsupervised.txt",
                       "val": "val.txt"},
              "torchsemiseg": {"labeled": "subset_train_aug/train_aug_labeled_1-{ratio}.txt",
                               "unlabeled": "subset_train_aug/train_aug_unlabeled_1-{ratio}.txt", "val": "val.txt"}}
#: a layout's folder of each list's images and labels where they are not ``JPEGImages`` and its label folder:
#: TorchSemiSeg's ``VOC`` reads ``<root>/<folder>/image/<id>.jpg`` and ``<root>/<folder>/label/<id>.png``, the folder
#: ``train_aug`` for a list whose file name holds ``train``, else the list's name (``val``) (dataloader.py 128-146)
SPLIT_FOLDERS = {"torchsemiseg": {"labeled": "train_aug", "unlabeled": "train_aug", "val": "val"}}
#: a layout's folder under the export folder where its files go (PS-MT's ``VOCDataset`` reads
#: ``<data_dir>/VOCdevkit/VOC2012``; its list folder is read from the working directory, that folder)
LAYOUT_FOLDER = {"psmt": "VOCdevkit/VOC2012"}
#: framework -> the layout its official script reads (UniMatch V2's ``supervised.py``: UniMatch's under the dataset
#: name ``pascal``, :data:`V2_SUPERVISED_DATASET`)
LAYOUT = {"supervised": "unimatch", "fixmatch": "unimatch", "unimatch": "unimatch", "u2pl": "u2pl", "augseg": "u2pl",
          "unimatch_v2": "unimatch", "fixmatch_v2": "unimatch", "supervised_v2": "pascal", "psmt": "psmt",
          "mt_cps": "torchsemiseg", "supervised_u2pl": "u2pl", "np_u2pl": "u2pl", "np_augseg": "u2pl"}
#: the dataset name UniMatch V2's ``supervised.py`` runs under: it draws ``n_upsampled[cfg['dataset']]`` labeled items
#: per epoch from a table of four datasets (supervised.py 167-175); ``pascal``'s 3000 is the smallest
V2_SUPERVISED_DATASET, V2_SUPERVISED_UPSAMPLED = "pascal", 3000
#: TorchSemiSeg MeanTeacher's evaluated epochs: script.sh's ``eval.py -e 20-34`` (checkpoints of epochs 20 and later,
#: counted from 0) of config.py's ``nepochs`` 34
MT_CPS_EVALUATED = (20, 34)
#: the EMA ratio's cap UniMatch V2's loops hard-code (unimatch_v2.py 221, fixmatch.py 212)
V2_EMA_DECAY = 0.996


def study_config(data_seed: int) -> StudyConfig:
    """The mini study's dataset instance of ``data_seed`` (``jobs/specs/mini.yaml``'s ``data.options``)."""
    options = dict(yaml.safe_load(MINI_SPEC.read_text())["overrides"]["data.options"])
    return StudyConfig.from_options(DATASET, **{**options, "seed": data_seed})


def study_of(config: RunConfig) -> StudyConfig:
    """The dataset instance of ``config`` (its ``data.options``)."""
    return StudyConfig.from_options(DATASET, **config.data.options)


def unlabeled_pool(config: RunConfig) -> int:
    """The unlabeled images of ``config``'s dataset instance at :data:`PARTITION` (what the export's unlabeled list
    holds): the official loops' ``N_u``."""
    data = study_of(config)
    return data.train_size - partition_counts(data.train_size)[PARTITION]


def to_uint8(image: Tensor) -> np.ndarray:
    """``[3, H, W]`` in [0, 1] -> ``[H, W, 3]`` uint8 (rounded)."""
    return (image.permute(1, 2, 0).numpy() * 255.0 + 0.5).clip(0, 255).astype(np.uint8)


def export_official_layout(config: StudyConfig, out: Path, partition: str = PARTITION,
                           layout: str = "unimatch", split: str = "val") -> dict[str, Path]:
    """The study data as the official dataset of ``layout`` (:data:`LAYOUTS`) reads it, under ``out``:
    ``JPEGImages/<id>.jpg`` (quality 100, no chroma subsampling), labels as PNG (mode ``L``: class indices, 255
    ignored; UniMatch ``SegmentationClass/<id>.png``, U2PL ``SegmentationClassAug/<id>.png``), the list files
    ``<lists>/<partition>/labeled.txt`` and ``unlabeled.txt`` and ``<lists>/val.txt``. UniMatch: ``splits/study``,
    one line ``JPEGImages/<id>.jpg SegmentationClass/<id>.png`` per item, paths relative to ``out`` (the official
    code reads ``splits/<dataset>/val.txt`` from the working directory, so a run works in ``out``). U2PL:
    ``splits/pascal_study`` (its ``BaseDataset`` takes a list whose path names ``pascal`` as VOC's), one ``<id>`` per
    line. The unlabeled images' labels are written too (both official datasets open the mask of every item,
    unlabeled ones included; it enters no loss). ``split``: the images of ``val.txt``, the validation split or the
    ``tune`` split (what settings are chosen on). PS-MT: everything under ``out/VOCdevkit/VOC2012`` (its
    ``VOCDataset`` root), the lists ``VocCode/DataLoader/voc_splits/<n>_train_supervised.txt``,
    ``<n>_train_unsupervised.txt`` (``n`` the labeled images) and ``val.txt`` under it (read from the working
    directory), one line ``/JPEGImages/<id>.jpg /SegmentationClassAug/<id>.png`` per item (the root joined with the
    path less its first character). TorchSemiSeg: ``train_aug/image``, ``train_aug/label`` (both training lists) and
    ``val/image``, ``val/label`` (:data:`SPLIT_FOLDERS`), the lists ``subset_train_aug/train_aug_labeled_1-<ratio>.txt``,
    ``..._unlabeled_...`` and ``val.txt`` under ``out``, one ``<id>`` per line. Returns the three list files."""
    label_folder, list_folder, line = LAYOUTS[layout]
    out = out / LAYOUT_FOLDER.get(layout, "")
    labeled, unlabeled = labeled_indices(config, partition_counts(config.train_size)[partition])
    evaluated = range(config.val_size if split == "val" else config.tune_size)
    streams = {"labeled": ("train", labeled), "unlabeled": ("train", unlabeled), "val": (split, evaluated)}
    part = partition.replace("/", "_")
    names = LIST_FILES.get(layout, {"labeled": f"{part}/labeled.txt", "unlabeled": f"{part}/unlabeled.txt",
                                    "val": "val.txt"})
    lists = {name: out / list_folder / file.format(labeled=len(labeled), ratio=partition.rpartition("/")[2])
             for name, file in names.items()}
    for list_name, (stream, indices) in streams.items():
        folder = SPLIT_FOLDERS.get(layout, {}).get(list_name)
        images, labels = (out / folder / "image", out / folder / label_folder) if folder else \
            (out / "JPEGImages", out / label_folder)
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        lines = []
        for index in indices:
            name = f"{stream}_{index:06d}"
            image, label = generate(config, stream, index)
            Image.fromarray(to_uint8(image)).save(images / f"{name}.jpg", quality=100, subsampling=0)
            Image.fromarray(label.numpy().astype(np.uint8), mode="L").save(labels / f"{name}.png")
            lines.append(line.format(name=name))
        lists[list_name].parent.mkdir(parents=True, exist_ok=True)
        lists[list_name].write_text("\n".join(lines) + "\n")
    return lists


def repeated_list(source: Path, length: int, out: Path) -> Path:
    """``source``'s lines repeated and cut to ``length`` into ``out`` (``unimatch.py``'s labeled set, ``ids *=
    ceil(nsample / len(ids))``, for ``supervised.py``: epochs of the same iterations)."""
    lines = source.read_text().splitlines()
    out.write_text("\n".join((lines * -(-length // len(lines)))[:length]) + "\n")
    return out


def project_config(framework: str, data_seed: int, seed: int, steps: int | None = None,
                   overrides: dict[str, Any] | None = None) -> RunConfig:
    """The project's cell: protocol ``released``, the mini study's overrides, the official pipeline's resize and blur
    (:data:`OFFICIAL_PIPELINES`), epochs of ``N_u / B_u`` iterations (the official ``len(trainloader_u)``), an
    evaluation every epoch and the best reported (the clean one only: no evaluation under shift, no student
    evaluation beside the teacher's; neither touches the training); supervised on UniMatch's network and weak
    pipeline (the AugSeg decoder variant, no classifier dropout, no strong view, the LR set after the step as
    ``supervised.py``); the time-dependent framework settings by the mini study's rule for epochs of that length
    (:func:`official_length_time_settings`). ``overrides``: more settings, applied before the rule (a regime's,
    ``--set``; the tests' smaller data and batches); ``data.options.<name>`` sets one option of the dataset instance;
    the official resize's base size follows the image size unless set (PS-MT's: 600 / 500 of it,
    :data:`BASE_SIZE_PER_IMAGE`). MT-CPS: the best of the epochs whose checkpoints TorchSemiSeg's ``eval.py``
    evaluates (``evaluation.select_from_epoch``, :func:`mt_cps_evaluated_from`). U2PL's ``train_sup.py``
    (``supervised_u2pl``): the project's ``supervised`` cell on U2PL's network, epochs of the labeled images, each
    evaluated. UniMatch V2's frameworks (:data:`V2`) start
    from ``jobs/specs/mini_vit.yaml``'s overrides instead (:func:`v2_settings`)."""
    settings = dict(yaml.safe_load((MINI_VIT_SPEC if framework in V2 else MINI_SPEC).read_text())["overrides"])
    settings.update(OFFICIAL_PIPELINES[framework])
    settings.update({"data.options": {**settings["data.options"], "seed": data_seed}, "seed": seed,
                     "schedule.epoch_length": "unlabeled", "schedule.eval_every_epochs": 1,
                     "schedule.checkpoint_every_steps": 0, "evaluation.select": "best",
                     "evaluation.corruptions": [], "evaluation.also_student": False,
                     "schedule.max_steps": steps or settings["schedule.max_steps"]})
    if framework == "supervised":
        settings.update({"model.decoder": "augseg", "head.options.dropout": 0.0, "data.augmentation.strong": None,
                         "schedule.lr_timing": "after_step"})
    if framework == "supervised_u2pl":  # train_sup.py's epoch: the labeled list once, evaluated after each
        settings["schedule.epoch_length"] = "labeled"
    if framework in V2:
        settings.update(v2_settings(framework, settings))
    if HEAD.get(framework) == "np":
        settings.update({**mini_head_settings("np"), **NP_EVALUATION})
    for key, value in (overrides or {}).items():  # data.options.<name>: one option of the instance, the others kept
        if key.startswith(DATA_OPTION):
            settings["data.options"] = {**settings["data.options"], key.removeprefix(DATA_OPTION): value}
        else:
            settings[key] = value
    if "data.augmentation.base_size" in OFFICIAL_PIPELINES[framework] and \
            "data.augmentation.base_size" not in (overrides or {}):  # the image's size, as VOC's 500 in the official
        image_size = StudyConfig.from_options(DATASET, **settings["data.options"]).image_size
        settings["data.augmentation.base_size"] = round(image_size * BASE_SIZE_PER_IMAGE.get(framework, 1.0))
    if framework == "mt_cps":  # the epochs whose checkpoints the official evaluates; the history counts them from 1
        settings["evaluation.select_from_epoch"] = \
            mt_cps_evaluated_from(settings["schedule.max_steps"] // official_iterations(settings)) + 1
    settings.update(v2_supervised_epochs(settings) if framework == "supervised_v2" else
                    {} if framework in V2 else official_length_time_settings(framework, settings))
    return released_cell(framework, settings)


def released_cell(framework: str, settings: dict[str, Any]) -> RunConfig:
    """The project's cell of ``framework`` (the study, 1/16, the baseline head or :data:`HEAD`'s, protocol
    ``released``) with ``settings`` as overrides."""
    return compose("paper", framework=PROJECT_FRAMEWORK.get(framework, framework), dataset=DATASET,
                   partition=PARTITION, head=HEAD.get(framework, "baseline"), protocol="released",
                   overrides=settings).config


def mini_head_settings(head: str) -> dict[str, Any]:
    """The mini study's ``cell_overrides`` of ``head``'s cells (``jobs/specs/mini.yaml``: the NP head's latent width)."""
    rules = yaml.safe_load(MINI_SPEC.read_text())["cell_overrides"]
    return {key: value for rule in rules if set(rule["when"]) == {"heads"} and head in rule["when"]["heads"]
            for key, value in rule["overrides"].items()}


def v2_settings(framework: str, settings: dict[str, Any]) -> dict[str, Any]:
    """What UniMatch V2's scripts do that ``mini_vit.yaml``'s cells do otherwise, as overrides of ``settings`` (its
    overrides): the EMA decay the official loop hard-codes (``min(1 - 1 / (iters + 1), 0.996)``, unimatch_v2.py 221,
    fixmatch.py 212), where the mini study scales it to 0.9 by its time rule (``cell_overrides``); nothing is patched
    in the official loop for it, the project's side takes the official value. Supervised (``supervised.py``): the
    official network's head, the DPT's one 1x1 class projection (``head.options.block: projection``, what switch
    ``unimatch_v2_projection_head`` gives UniMatch V2's cells; ``supervised_unimatch_v2`` has U2PL's classifier block),
    no strong view, the LR set after the step (supervised.py 229-232), and the batch doubled as ``supervised.py``
    doubles ``cfg['batch_size']`` (115: a supervised step sees as many images as a semi-supervised step's labeled and
    unlabeled ones; ``supervised_unimatch_v2`` keeps 8)."""
    if framework != "supervised_v2":
        return {"framework_options.ema_decay": V2_EMA_DECAY}
    return {"head.options.block": "projection", "data.augmentation.strong": None, "schedule.lr_timing": "after_step",
            "schedule.batch_size": 2 * settings["schedule.batch_size"]}


def v2_supervised_items(unlabeled: int) -> int:
    """The labeled list's length in UniMatch V2's ``supervised.py`` run: repeated to the smallest multiple of the
    unlabeled pool's size ``unlabeled`` not under ``n_upsampled['pascal']`` (:data:`V2_SUPERVISED_UPSAMPLED`: the
    script repeats a shorter list to 3000 items, supervised.py 167-175, dataset/semi.py 25-27), so that an epoch is a
    whole number of the semi-supervised runs' and a run of the mini study's steps is whole epochs."""
    return unlabeled * -(-V2_SUPERVISED_UPSAMPLED // unlabeled)


def v2_supervised_epochs(settings: dict[str, Any]) -> dict[str, Any]:
    """The project's side of UniMatch V2's ``supervised.py``: epochs of the labeled images (``n_l / B``) evaluated
    every ``eval_every_epochs`` of them, as many iterations as an official epoch (:func:`v2_supervised_items` / B).
    ValueError where the official epoch is not a whole number of labeled epochs."""
    data = StudyConfig.from_options(DATASET, **settings["data.options"])
    labeled = partition_counts(data.train_size)[PARTITION]
    batch = settings["schedule.batch_size"]
    official, own = v2_supervised_items(data.train_size - labeled) // batch, labeled // batch
    if own == 0 or official % own:
        raise ValueError(f"supervised_v2: an official epoch of {official} iterations (batch {batch}) is not a whole "
                         f"number of the {labeled} labeled images' epochs of {own} iterations")
    return {"schedule.epoch_length": "labeled", "schedule.eval_every_epochs": official // own}


def official_length_time_settings(framework: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``framework``'s paper options scaled by the mini study's rule (``npsemiseg.short_run.scale_time_settings``, the
    rule ``jobs/specs/mini.yaml``'s ``cell_overrides`` follow) to the run ``settings`` describe with epochs of the
    official length, ``N_u / B_u`` iterations: as overrides (``framework_options.<key>``; none for the UniMatch
    family, which has no time-dependent settings). U2PL at 960 steps of 120 iterations: EMA decay 0.9 and queues of
    356 / 593 keys as the mini study's (they follow steps and pixels), ``sup_only_epochs`` 1 (the paper's one epoch
    of 80 is 0.1 of these, floored at one; the mini study's 2 are of 8-iteration epochs). PS-MT: EMA keep rate 0.9
    and ramp-up 1.2 epochs (the paper's 12 x 0.1), and the released warm-up (switch ``psmt_warmup_epochs``: 5, not a
    paper option, which the mini study's ``corrected`` cells leave at 0) scaled alike: 0.5, floored at one epoch.
    MT-CPS: the options of the cell's name (``mt``, :data:`PROJECT_FRAMEWORK`, as the mini study scales them): EMA
    decay 0.9 as the mini study's (``mt_cps`` takes none of the others)."""
    run = RunLength.of(steps=settings["schedule.max_steps"], iters_per_epoch=official_iterations(settings),
                       images_per_step=settings["schedule.batch_size"] + settings["schedule.unlabeled_batch_size"],
                       crop_size=settings["schedule.crop_size"])
    paper = get_framework(PROJECT_FRAMEWORK.get(framework, framework)).paper_options(DATASET, PARTITION)
    if framework == "psmt":
        paper["warmup_epochs"] = released_cell(framework, settings).framework_options["warmup_epochs"]
    return {f"framework_options.{key}": value for key, value in scale_time_settings(paper, run).items()}


def official_iterations(settings: dict[str, Any]) -> int:
    """The iterations of an official epoch of the run ``settings`` describe: ``N_u / B_u``."""
    data = StudyConfig.from_options(DATASET, **settings["data.options"])
    unlabeled = data.train_size - partition_counts(data.train_size)[PARTITION]
    return unlabeled // settings["schedule.unlabeled_batch_size"]


def mt_cps_evaluated_from(epochs: int) -> int:
    """The first epoch (counted from 0, as its checkpoints ``epoch-<e>.pth`` are) whose checkpoint TorchSemiSeg's
    MeanTeacher evaluates in a run of ``epochs``: script.sh's ``eval.py -e 20-34`` of config.py's 34 epochs
    (:data:`MT_CPS_EVALUATED`) scaled to ``epochs`` and rounded, no earlier than the first checkpoint train.py saves
    (those of epochs after ``epochs // 2``, and the last)."""
    first, of = MT_CPS_EVALUATED
    return min(max(round(first * epochs / of), epochs // 2 + 1), epochs - 1)


def official_epoch_items(framework: str, config: RunConfig) -> int:
    """The items of one official epoch of ``framework``: ``N_u`` (:func:`unlabeled_pool`); UniMatch V2's
    ``supervised.py``: the labeled list's repeated length (:func:`v2_supervised_items`); U2PL's ``train_sup.py``: the
    labeled list (its ``build_vocloader`` leaves the list as it is: ``voc_dset``'s ``split`` stays ``val``)."""
    unlabeled = unlabeled_pool(config)
    if framework == "supervised_u2pl":
        return study_of(config).train_size - unlabeled
    return v2_supervised_items(unlabeled) if framework == "supervised_v2" else unlabeled


def official_epochs(framework: str, config: RunConfig) -> int:
    """How many official epochs ``config``'s ``schedule.max_steps`` are: an official epoch is ``N_u / B`` iterations
    (the unlabeled pool's; UniMatch V2's ``supervised.py``: :func:`v2_supervised_items` / B). ValueError naming the
    steps and the epoch's length where they are not a whole number of epochs (the official loops count epochs).
    PS-MT: its semi-supervised epochs, the cell's warm-up epochs left out (:func:`psmt_warm_up_epochs`: its warm-up
    runs before its ``epochs``); ValueError where the warm-up leaves none."""
    items = official_epoch_items(framework, config)
    per_epoch, steps = items // config.schedule.batch_size, config.schedule.max_steps
    if per_epoch < 1 or steps % per_epoch or steps < per_epoch:
        raise ValueError(f"--steps: {framework}'s official script counts epochs of {per_epoch} iterations ({items} "
                         f"items / batch {config.schedule.batch_size}); {steps} iterations is not a whole number of "
                         f"them: use a multiple of {per_epoch}")
    if framework == "psmt":
        warm_up = config.framework_options["warmup_epochs"]
        if steps // per_epoch <= warm_up:
            raise ValueError(f"--steps: psmt's {steps} iterations are {steps // per_epoch} epochs of {per_epoch}, "
                             f"no more than its {warm_up} warm-up epochs: use more than {warm_up * per_epoch}")
        return steps // per_epoch - warm_up
    return steps // per_epoch


def official_cfg(config: RunConfig, data_root: Path, epochs: int) -> dict[str, Any]:
    """The official script's config (``configs/pascal.yaml``'s keys) with the cell's values."""
    return {"dataset": DATASET, "nclass": config.num_classes, "crop_size": config.schedule.crop_size,
            "data_root": str(data_root), "epochs": epochs, "batch_size": config.schedule.batch_size,
            "lr": config.optim.lr, "lr_multi": config.optim.head_lr_mult,
            "criterion": {"name": "CELoss", "kwargs": {"ignore_index": 255}},
            "conf_thresh": float(config.framework_options.get("confidence_threshold", 0.95)),
            "model": "deeplabv3plus", "backbone": config.model.backbone}


def project_run(config: RunConfig) -> dict[str, Any]:
    """The project's cell: its per-epoch mIoU x 100 (``curve``), the reported (best) and the last."""
    result = train(config)
    per_step: dict[float, float] = {}
    for evaluation in result.history:  # the last epoch's evaluation and the final one are of the same weights
        per_step.setdefault(evaluation["step"], 100.0 * evaluation["miou"])
    return {"curve": list(per_step.values()),
            "best": 100.0 * result.metrics["best/miou"], "last": 100.0 * result.metrics["last/miou"],
            "seconds": result.seconds}

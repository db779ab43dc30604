"""Whole official training runs on the mini-study's data, beside the project's cell with the same settings.

For each seed, four runs of 960 iterations on the study dataset (``jobs/specs/mini.yaml``'s data, network and
schedule; data seed ``--data-seed``, partition 1/16):

- **official**: the official training script (``--framework``'s, :data:`OFFICIAL`) run end to end, its ``main()``
  imported from the checkout under ``--official-root`` (``<owner>+<repo>`` or ``<repo>`` folders, as
  ``official_side_by_side.py``; nothing of it is copied into the project): its data pipeline (``SemiDataset``:
  resize, crop and its padding, flip, the strong views, CutMix boxes), samplers, loss, optimiser, poly schedule,
  per-epoch evaluation and best-checkpoint report. It reads the study data exported in its layout
  (:func:`export_official_layout`: JPEG images, PNG labels, the official list files). What a CPU run needs is
  patched, and nothing else: every patch is a monkeypatch listed in :data:`PATCHES`, printed with the result and
  written into it. The network is the project's (:class:`OfficialInterface`), built with the project's initial
  weights of the seed, the pretrained backbone included, behind the official model's interface.
- **project**: the project's cell with the same settings (:func:`project_config`: protocol ``released``, the mini
  study's overrides, the official pipeline's resize and blur, epochs of the official length, an evaluation per
  epoch and the best one reported, as the official script does).
- **supervised**, both ways: UniMatch's ``supervised.py`` on the same network and data pipeline (the labeled list
  repeated to the unlabeled pool's length, as ``unimatch.py`` repeats it, so that an epoch has the same iterations),
  and the project's ``supervised`` cell with the same settings.

Output ``--out/official_runs.json``: ``{"framework", "data_seed", "runs": [{"seed", "official_miou", "project_miou",
"official_curve", "project_curve", ...}], "supervised": [{"seed", "official_miou", "project_miou", ...}], "patches",
...}``, mIoU x 100 on the validation split (the best of the per-epoch evaluations, as both report; the last one
beside it). :func:`equivalence` is the two one-sided tests of official against project.

    python benchmarks/official_runs.py --official-root ROOT --framework unimatch --data-seed 7919 --seeds 0 1 --out DIR
    # the sides of a seed in parallel processes, then joined, and the curves drawn (with the supervised reference's):
    python benchmarks/official_runs.py ... --framework unimatch --seeds 0 --no-supervised --side official --out A
    python benchmarks/official_runs.py ... --framework unimatch --seeds 0 --no-supervised --side project --out B
    python benchmarks/official_runs.py ... --framework supervised --seeds 0 --out C
    python benchmarks/official_runs.py --combine A/official_runs.json B/official_runs.json C/official_runs.json --out D
    python benchmarks/official_runs.py --figure curves.png --combine D/official_runs.json   # also curves.jsonl
    # a regime (a change of the study's scale: does the official code put UniMatch >= FixMatch > supervised there?),
    # both sides changed alike and evaluated on the tune split, where settings are chosen:
    python benchmarks/official_runs.py ... --framework unimatch --split tune \
        --set data.options.image_size=96 --set schedule.crop_size=96 --out E

A 960-iteration side took 15-23 min (supervised) and about an hour (UniMatch) on a 2-core VM at load 17-38, and
9.4-11.6 min (UniMatch, one thread) at load 4-8 (``docs/learning.md``, "Whole runs: official vs project").
Supervised here is UniMatch's ``supervised.py`` (the network and pipeline of ``unimatch.py``), not U2PL's
``train_sup.py``, also beside ``--framework u2pl`` (``--no-supervised`` leaves it out).

U2PL (``--framework u2pl``: Haochen-Wang409/U2PL's ``train_semi.py``, :func:`run_official_u2pl`): its ``main()``
with its ``get_loader`` (``voc_dset`` on the export in U2PL's layout, :data:`LAYOUTS`: list files of ids under a
``pascal`` folder, labels in ``SegmentationClassAug``; ``n_sup`` set so that both sets are drawn to the unlabeled
pool's size, as on VOC, so an epoch is ``N_u / B`` iterations), its transforms (``rand_resize`` [0.5, 2], flip,
``rand`` crop padding the image with 0 and the label with 0, no blur; validation ``center`` crop of the crop size:
the whole 64 px image), ``DistributedSampler``, ``Criterion``, CutMix, unsupervised and contrastive losses, memory
bank, EMA teacher, poly LR, per-epoch ``validate`` (student before ``sup_only_epoch``, teacher after) and the best.
Its config (:func:`u2pl_cfg`) is ``experiments/pascal/1464/ours/config.yaml`` of the checkout (drop_percent,
thresholds, ranks, temperature, queries, negatives, loss weights 1) with the cell's crop, batches, LR, weight
decay, EMA decay, epochs and ``sup_only_epoch``. The project's side takes the same (:func:`project_config`): the
official pipeline (:data:`OFFICIAL_PIPELINES`), and the mini study's time rule (``npsemiseg.short_run``, the rule
of ``jobs/specs/mini.yaml``'s ``cell_overrides``) applied to epochs of the official length: EMA decay 0.9 and
queues of 356 / 593 keys as in the mini study (they scale with steps and pixels), ``sup_only_epochs`` 1 (one
epoch of 120 iterations; the mini study's 2 are of 8 iterations). What differs from U2PL's own run, and why
(:data:`U2PL_PATCHES`): the network is the project's U2PL network of the cell (its decoder is 16 / 8 channels
wide, its heads 64, its representation 16; U2PL's decoder hard-codes 256, so it cannot hold it) behind
``ModelBuilder``'s interface (:class:`U2PLInterface`); ``main`` hard-codes memory banks 256 wide and queues of
30000 / 50000, replaced by the representation's width and the cell's queues; no aux head (the mini study has
none); data loading in the main process (``workers: 0``, as the project's cell).

AugSeg (``--framework augseg``: zhenzhao/AugSeg's ``train_semi.py``, :func:`run_official_augseg`) the same way: its
``main(args)`` on the same layout, with its transforms (the long side a random integer in [0.5, 2] x the base size,
the image's 64 here as VOC's 500, flip, a random crop padded at the bottom and right with the mean and 255, its
strong views with their blur sigma in [0.1, 2]), adaptive CutMix, thresholded unsupervised loss, EMA of parameters
and buffers, poly LR and per-epoch validation of the whole image, the teacher's best reported; its config
``exps/zrun_vocs/r50_voc_semi662/config_semi.yaml`` (VOC 1/16) with the cell's data, crop, batch, LR, weight decay,
EMA decay (0.927167: the mini study's, by the same rule), threshold, unsupervised weight and epochs; only the teacher
evaluated (``evaluate_student: False``, the project's side alike). Its patches (:data:`AUGSEG_PATCHES`): the CPU
ones, the network (the project's AugSeg network behind ``ModelBuilder``, :class:`AugSegInterface`), a discarding
tensorboard, ``skimage`` stand-ins, the iterator's ``next()`` and NumPy 1's ``uint8`` cast in its strong views' hue
operation (:class:`Numpy1Uint8`). The project's side: its ``augseg`` cell under
``released`` with UniMatch's pipeline settings (:data:`OFFICIAL_PIPELINES`: AugSeg's resize, padding placement and
blur are UniMatch's; its crop pads the image with the ImageNet mean where UniMatch's pads it with black).

UniMatch V2 (``--framework unimatch_v2``, ``fixmatch_v2``, ``supervised_v2``: LiheYoung/UniMatch-V2's
``unimatch_v2.py``, ``fixmatch.py``, ``supervised.py``, :func:`official_v2_run`) on the mini study's ViT
(``jobs/specs/mini_vit.yaml``: ``vit_mini`` + the DPT at 16 features, ``pretrained:vit_mini``, crop 56, AdamW at 5e-5
with the head at x40, batch 8 + 8, 960 iterations): each ``main()`` on the export in UniMatch's layout (V2's
``SemiDataset`` reads V1's; the same transforms: resize of the long side in [0.5, 2] x, crop padded with 0 and 255
(254 -> ignored in the unlabeled views), flip, colour jitter, grey, blur sigma in [0.1, 2], CutMix boxes), its
samplers, losses, EMA teacher (ratio ``min(1 - 1 / (iters + 1), 0.996)``, parameters and buffers), poly LR set after
the step and two evaluations per epoch (the model, then the EMA: ``evaluate(..., multiplier=14)``, the whole image
resized to multiples of 14 and back). Reported: the EMA's best (``official_miou``, ``official_curve``: what the
project's cell evaluates and what the published numbers are), the model's beside it (``official_student_miou``,
``official_student_curve``); ``supervised.py``'s model. Patches (:data:`V2_PATCHES`): the CPU ones, ``DPT`` by
:class:`DPTInterface` (the project's network of the cell, its complementary dropout the project's
``complementary_pass``), ``torch.load`` of ``./pretrained/<backbone>.pth`` answered with the project's backbone state
dict of the seed, the loaders in the process (``num_workers`` 0 for the scripts' 4), a discarding tensorboard, the
class names, the evaluations recorded. Settings (:func:`v2_cfg`, :func:`v2_settings`): the official EMA decay 0.996
on the project's side too (``mini_vit.yaml`` scales it to 0.9; nothing in the official loop is patched for it), the
official pipeline as for UniMatch (:data:`OFFICIAL_PIPELINE`). What differs from the mini study's cells, and why:
the pipeline (as for every framework here) and the EMA decay (the official's). The crop's image padding is black on
both sides (switch ``crop_fill``, deviation D18; the ImageNet mean on the project's side before 2026-11-29).
``supervised_v2`` is not ``mini_vit.yaml``'s ``supervised_unimatch_v2`` but the official ``supervised.py`` both ways:
the DPT's 1x1 class projection as head (not U2PL's block), the LR after the step, the batch doubled to 16
(``supervised.py`` doubles ``cfg['batch_size']``; the official config gets 8), and epochs of 240 iterations (the script draws
``n_upsampled[cfg['dataset']]`` items an epoch from a four-dataset table: it runs under the name ``pascal``, whose 3000
is the smallest, the labeled list repeated to 3840, a multiple of the 960 unlabeled images; the project's side
evaluates every 60 labeled epochs of 4 iterations): four evaluations in 960 iterations, not eight.

PS-MT (``--framework psmt``: yyliu01/PS-MT's ``VocCode/main.py``, :func:`run_official_psmt`): ``main(-1, 1, config,
args)``, what its ``__main__`` calls with one GPU (no DDP: ``DataParallel`` without devices runs the module in the
process; no process group), with its config dict (:func:`psmt_cfg`: ``configs/config_deeplab_v3+.json`` of the
checkout with ``main.py``'s arguments and the cell's settings) on the export in its layout (:data:`LAYOUTS` ``psmt``:
``VOCdevkit/VOC2012`` with ``<n>_train_supervised.txt`` lists under ``VocCode/DataLoader/voc_splits``): its ``VOC``
loaders and transforms (the long side a random integer in [0.5, 2] x ``base_size``, 600 / 500 of the image as on VOC:
77 px; a 64 px crop padded at the bottom and right with the mean and 255; flip; the strong view's jitter, grey and
blur), the labeled loader cycled, the warm-up of the three networks (``_warm_up``), then per epoch the alternating core
teacher, the assist mask, CutMix, ``EntireModel.forward`` (the student's two passes with the T-VAT decoder,
``semi_ce_loss``, the cosine ``ConsistencyWeight``), SGD, ``Poly``, the EMA of the core teacher's state and the
whole-image validation of both teachers' mean logits; the best of the per-epoch mIoU reported (PS-MT logs each and
names its checkpoints by it). The network: the project's PS-MT networks of the cell (the ``psmt`` decoder; the
student with the pretrained backbone, the teachers with their own initialisation and scratch backbones, as the
released cell builds them) behind ``EntireModel``, split as the PS-MT golden recorder splits them (its ``Encoder`` and
``Upsample``, imported: :func:`psmt_entire_model`). Patches (:data:`PSMT_PATCHES`): ``.cuda()``, the network,
VOC's 21 classes where the code hard-codes them (the dataset's ``num_classes``, ``semi_ce_loss``'s one-hot: the
logits padded with classes of softmax 0; the assist teacher's top 7 of K < 7 classes: all), the EMA keep rate at its
call site, ``np.int``, the wandb board and its imports (wandb, seaborn: not installed), the evaluation recorded.
Settings: the mini study's time rule for epochs of the official length: EMA keep rate 0.9, ramp-up 1.2 epochs, and
the released warm-up of 5 epochs scaled alike to one: 120 iterations, in PS-MT's units 15 passes of its labeled
loader (8 iterations) for each network, then ``epochs`` 7 (:func:`psmt_warm_up_epochs`, :func:`official_epochs`).
What differs from the project's side, and why (the official code's, not patched): the student's LR is the base LR in
the warm-up and ``Poly`` runs over the 7 semi-supervised epochs (the project's poly runs over all 960 steps); the
warm-up passes the three networks through their own labeled batches (the project's share one); ``cycle`` replays
the first pass's labeled batches, augmentations included, every epoch; ``main`` seeds ``random`` and torch with 42
whatever the seed (the official seeds differ in the initial weights and NumPy's CutMix draws only); its resize is
bicubic; the official side evaluates the 7 semi-supervised epochs, the project's the warm-up epoch too. Supervised
reference: UniMatch's ``supervised.py``, as for the others (not the mini study's ``supervised_psmt``).
"""

from __future__ import annotations

import argparse
import collections
import collections.abc
import contextlib
import copy
import datetime
import importlib
import json
import logging
import os
import platform
import random
import shlex
import sys
import time
import types
import unittest.mock
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from PIL import Image
from scipy import stats
from torch import Tensor, nn

from npsemiseg.config import RunConfig, compose
from npsemiseg.data.study import StudyConfig, generate, labeled_indices, partition_counts
from npsemiseg.frameworks import get_framework
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.frameworks.unimatch_v2 import complementary_masks, complementary_pass
from npsemiseg.models import upsample_logits
from npsemiseg.short_run import RunLength, scale_time_settings
from npsemiseg.training import train
from npsemiseg.training.data_order import derive_seed
from npsemiseg.training.factories import build_framework

from official_side_by_side import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    U2PL_CONFIG,
    U2PL_UNUSED_MODULES,
    checkout,
    official_imports,
    one_process_group,
    stand_ins,
)

ROOT = Path(__file__).resolve().parents[1]
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
            "augseg": ("zhenzhao/AugSeg", "train_semi.py"),
            "unimatch_v2": ("LiheYoung/UniMatch-V2", "unimatch_v2.py"),
            "fixmatch_v2": ("LiheYoung/UniMatch-V2", "fixmatch.py"),
            "supervised_v2": ("LiheYoung/UniMatch-V2", "supervised.py"),
            "psmt": ("yyliu01/PS-MT", "VocCode/main.py")}
#: UniMatch V2's frameworks, on the mini study's ViT (``jobs/specs/mini_vit.yaml``)
V2 = ("unimatch_v2", "fixmatch_v2", "supervised_v2")
#: the supervised references: UniMatch's ``supervised.py`` (the DeepLabv3+ frameworks'), UniMatch V2's (the ViT's)
SUPERVISED = {"supervised": "supervised", "unimatch_v2": "supervised_v2", "fixmatch_v2": "supervised_v2",
              "supervised_v2": "supervised_v2"}
#: a framework's name in the project's registry where it differs (supervised on the ViT is the project's
#: ``supervised``, as ``mini_vit.yaml``'s ``supervised_unimatch_v2``)
PROJECT_FRAMEWORK = {"supervised_v2": "supervised"}
#: the official pipeline's settings the mini study changes (``resize: none``, a blur scaled to 64 px): back to the
#: official code's, on the project's side too (UniMatch: long side in [0.5, 2] x the image's, blur sigma in [0.1, 2]),
#: and UniMatch's crop: padded at the bottom and right with black (the released UniMatch family's switches
#: ``crop_padding`` and ``crop_fill``, set here for the supervised reference too, whose project framework they do not
#: cover; the project's side padded with the ImageNet mean before 2026-11-29)
OFFICIAL_PIPELINE = {"data.augmentation.resize": "long_side", "data.augmentation.base_size": 64,
                     "data.augmentation.blur_sigma": [0.1, 2.0], "data.augmentation.crop_padding": "bottom_right",
                     "data.augmentation.crop_fill": "zero"}
#: U2PL's (``rand_resize: [0.5, 2.0]``: a scale of the image, nothing to scale to 64 px; padded on both sides; its
#: label padding with 0 is the project's ``released``; no blur: U2PL has no strong view)
U2PL_PIPELINE = {"data.augmentation.resize": "rescale_balanced", "data.augmentation.scale_range": [0.5, 2.0],
                 "data.augmentation.crop_padding": "centered"}
#: AugSeg's is UniMatch's (``Resize``: the long side a random integer in [0.5, 2] x ``resize_base_size``, the image's
#: 64 here as VOC's 500; padded at the bottom and right; its strong views' blur sigma in [0.1, 2]) but for the crop's
#: image fill: the ImageNet mean (``augs_TIBA.py`` ``Crop``)
AUGSEG_PIPELINE = {**OFFICIAL_PIPELINE, "data.augmentation.crop_fill": "mean"}
#: PS-MT's is AugSeg's (``Base/base_dataset.py``: the long side a random integer in [0.5, 2] x ``base_size``, a crop
#: padded at the bottom and right with the mean and 255, flip; its strong view's blur sigma in [0.1, 2]) with its
#: ``base_size`` 600 for VOC's 500 px images (:data:`BASE_SIZE_PER_IMAGE`)
PSMT_PIPELINE = AUGSEG_PIPELINE
OFFICIAL_PIPELINES = {"supervised": OFFICIAL_PIPELINE, "fixmatch": OFFICIAL_PIPELINE, "unimatch": OFFICIAL_PIPELINE,
                      "u2pl": U2PL_PIPELINE, "augseg": AUGSEG_PIPELINE, "psmt": PSMT_PIPELINE,
                      **dict.fromkeys(V2, OFFICIAL_PIPELINE)}
#: the official resize's base size per image size where it is not the image's (VOC's images are 500 px): PS-MT's
#: ``base_size`` 600 (``configs/config_deeplab_v3+.json``)
BASE_SIZE_PER_IMAGE = {"psmt": 600 / 500}
#: the export's layouts: label folder, list folder, one list line of item ``name`` (``u2pl``: also AugSeg's)
LAYOUTS = {"unimatch": ("SegmentationClass", f"splits/{DATASET}", "JPEGImages/{name}.jpg SegmentationClass/{name}.png"),
           "u2pl": ("SegmentationClassAug", f"splits/pascal_{DATASET}", "{name}"),
           "pascal": ("SegmentationClass", "splits/pascal", "JPEGImages/{name}.jpg SegmentationClass/{name}.png"),
           "psmt": ("SegmentationClassAug", "VocCode/DataLoader/voc_splits",
                    "/JPEGImages/{name}.jpg /SegmentationClassAug/{name}.png")}
#: a layout's list files where they are not ``<partition>/labeled.txt``, ``<partition>/unlabeled.txt`` and
#: ``val.txt`` under its list folder (PS-MT: ``<n labeled>_train_supervised.txt``, ``DataLoader/voc.py`` 40-46)
LIST_FILES = {"psmt": {"labeled": "{labeled}_train_supervised.txt", "unlabeled": "{labeled}_train_unsupervised.txt",
                       "val": "val.txt"}}
#: a layout's folder under the export folder where its files go (PS-MT's ``VOCDataset`` reads
#: ``<data_dir>/VOCdevkit/VOC2012``; its list folder is read from the working directory, that folder)
LAYOUT_FOLDER = {"psmt": "VOCdevkit/VOC2012"}
#: framework -> the layout its official script reads (UniMatch V2's ``supervised.py``: UniMatch's under the dataset
#: name ``pascal``, :data:`V2_SUPERVISED_DATASET`)
LAYOUT = {"supervised": "unimatch", "fixmatch": "unimatch", "unimatch": "unimatch", "u2pl": "u2pl", "augseg": "u2pl",
          "unimatch_v2": "unimatch", "fixmatch_v2": "unimatch", "supervised_v2": "pascal", "psmt": "psmt"}
#: the dataset name UniMatch V2's ``supervised.py`` runs under: it draws ``n_upsampled[cfg['dataset']]`` labeled items
#: per epoch from a table of four datasets (supervised.py 167-175); ``pascal``'s 3000 is the smallest
V2_SUPERVISED_DATASET, V2_SUPERVISED_UPSAMPLED = "pascal", 3000
#: the official ViT configs' entry the replaced DPT's arguments come from (``model_configs[cfg['backbone'].split('_')
#: [-1]]``, unimatch_v2.py 53-59); the network is the project's whatever the entry
V2_MODEL_CONFIG = "small"
#: the EMA ratio's cap UniMatch V2's loops hard-code (unimatch_v2.py 221, fixmatch.py 212)
V2_EMA_DECAY = 0.996
#: the patches of a CPU run of any official script: (what is replaced, by what, why)
CPU_PATCHES = (
    ("torch.Tensor.cuda, torch.nn.Module.cuda", "return the object unchanged", "a CPU run"),
    ("torch.nn.parallel.DistributedDataParallel", "the same class with device_ids and output_device None",
     "DDP of a CPU module takes no device ids"),
    ("torch.nn.SyncBatchNorm.convert_sync_batchnorm", "return the module unchanged",
     "SyncBatchNorm needs CUDA; with one process it is BatchNorm over the same batch"),
)
#: UniMatch's and UniMatch V2's process group and tensorboard
ONE_RANK_PATCH = ("util.dist_helper.setup_distributed (as the script imported it)", "a one-rank gloo process group, rank 0",
                  "no GPU, no launcher: the script's collectives (DDP, evaluate's all_reduce) run in one CPU process")
TENSORBOARD_PATCH = ("torch.utils.tensorboard", "a SummaryWriter that discards",
                     "tensorboard is not installed; logging only")
#: every change made to the official UniMatch scripts' runs, the only ones
PATCHES = (
    ONE_RANK_PATCH,
    *CPU_PATCHES,
    ("DeepLabV3Plus (as the script imported it)", "OfficialInterface: the project's network of the cell",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included"),
    TENSORBOARD_PATCH,
    ("util.classes.CLASSES", "an entry 'study' with the study's class names", "the per-class log lines"),
    ("evaluate (as the script imported it)", "the same function, its result also recorded",
     "the per-epoch curve; nothing changed"),
)
#: every change made to U2PL's ``train_semi.py`` run, the only ones
U2PL_PATCHES = (
    ("u2pl.utils.dist_helper.setup_distributed (as train_semi imported it)",
     "a one-rank gloo process group, rank 0, world size 1",
     "no GPU, no launcher: the script's collectives (DDP, samplers, all_reduce, the memory bank's all_gather) run in "
     "one CPU process"),
    *CPU_PATCHES,
    ("ModelBuilder (as train_semi imported it: the student and the teacher)",
     "U2PLInterface: the project's U2PL network of the cell, outputs {'pred', 'rep'} at feature resolution",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included (U2PL's "
     "decoder hard-codes 256 channels); the teacher built the same way, as U2PL builds both pretrained"),
    ("train (as main calls it): its memobank and queue_size",
     "memory banks of the representation's width and the cell's queue lengths (background first)",
     "main hard-codes banks 256 wide (the project's representation is narrower) and queues of 50000 / 30000 (the mini "
     "study's are scaled to the short run)"),
    ("tensorboardX", "a module whose SummaryWriter discards", "tensorboardX is not installed; logging only"),
    ("skimage, skimage.measure (where not installed)", "stand-ins whose functions raise",
     "u2pl.utils.utils imports them at its top; the run never calls them"),
    ("collections.Iterable", "collections.abc.Iterable", "gone from collections since Python 3.10; the transforms' "
     "isinstance checks"),
    ("the DataLoader iterator's next()", "its __next__", "train calls the name torch's iterator no longer has"),
    ("validate (as main calls it)", "the same function, its result also recorded (x 100)",
     "the per-epoch curve; nothing changed"),
)
#: every change made to AugSeg's ``train_semi.py`` run, the only ones
AUGSEG_PATCHES = (
    ("augseg.utils.dist_helper.setup_distributed (as train_semi imported it)",
     "a one-rank gloo process group, rank 0, world size 1",
     "no GPU, no launcher: the script's collectives (DDP, barrier, samplers, all_reduce) run in one CPU process"),
    *CPU_PATCHES,
    ("ModelBuilder (as train_semi imported it: the student and the teacher)",
     "AugSegInterface: the project's AugSeg network of the cell, outputs (logits at image size, None)",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included (AugSeg's "
     "decoder hard-codes 256 channels); the teacher built the same way, as AugSeg builds both pretrained"),
    ("torch.utils.tensorboard", "a SummaryWriter that discards", "tensorboard is not installed; logging only"),
    ("skimage, skimage.measure (where not installed)", "stand-ins whose functions raise",
     "augseg.utils.utils imports them at its top; the run never calls them"),
    ("the DataLoader iterator's next()", "its __next__", "train calls the name torch's iterator no longer has"),
    ("numpy.uint8 as augseg.dataset.augs_TIBA calls it", "NumPy 1's cast of a Python number: wrapped modulo 256",
     "NumPy 2 raises on the hue operation's negative shift, np.uint8(hue_factor * 255), which AugSeg's NumPy 1 "
     "wrapped, as its comment says ('uint8 addition take cares of rotation across boundaries')"),
    ("validate (as main calls it)", "the same function, its result also recorded (x 100)",
     "the per-epoch curve; nothing changed"),
)
#: every change made to UniMatch V2's scripts' runs (``unimatch_v2.py``, ``fixmatch.py``, ``supervised.py``), the only
#: ones; the settings that are not patches but the cell's are :func:`v2_cfg`'s
V2_PATCHES = (
    ONE_RANK_PATCH,
    *CPU_PATCHES,
    ("DPT (as the script imported it)",
     "DPTInterface: the project's vit_mini + DPT network of the cell behind DPT's interface (backbone, head, "
     "lock_backbone, forward(x, comp_drop)), complementary dropout by the project's function",
     "the study's small ViT with the project's initial weights of the seed; cfg['backbone'] 'vit_mini_small' only "
     "picks model_configs' 'small' entry, whose widths the replaced DPT ignores"),
    ("torch.load of ./pretrained/<cfg['backbone']>.pth", "the project's backbone state dict of the seed (pretrained:"
     "vit_mini), which the script loads into model.backbone; any other path: torch.load itself",
     "the official DINOv2 weights are not the mini study's backbone"),
    ("DataLoader (as the script imported it)", "the same class with num_workers 0",
     "the script's 4 (1 for validation) loader processes on a 2-core machine: loading in the process, one thread, as "
     "the project's cell (data.num_workers 0); the items' draws come from the same seeded generators"),
    TENSORBOARD_PATCH,
    ("util.classes.CLASSES", "the entry of the run's dataset name (study; pascal for supervised.py) holding the "
     "study's class names", "the per-class log lines"),
    ("evaluate (as the script imported it)", "the same function, its results also recorded",
     "the per-epoch curves (unimatch_v2.py and fixmatch.py evaluate the model, then its EMA: both recorded); nothing "
     "changed"),
)
#: every change made to PS-MT's ``VocCode/main.py`` ``main(-1, 1, config, args)`` run (no DDP: the script's own
#: one-process path, ``args.ddp`` False, ``DataParallel`` without devices), the only ones; the settings that are not
#: patches but the cell's are :func:`psmt_cfg`'s and :func:`psmt_args`'
PSMT_PATCHES = (
    *CPU_PATCHES,
    ("model_deep (EntireModel, as main imported it)",
     "an EntireModel whose encoder1/2/_s and decoder1/2/_s hold the project's PS-MT networks of the cell (student, "
     "teacher 1, teacher 2), split as the PS-MT golden recorder splits them (tests/golden/record_psmt_step_golden.py "
     "Encoder, Upsample: backbone + decoder, classifier head upsampled with align_corners=True); its forward, "
     "warm_up_forward, T-VAT decoder and losses the official ones, its ConsistencyWeight main's",
     "the study's small network with the project's initial weights of the seed (the student's pretrained backbone, "
     "the teachers' own initialisation and scratch backbones as the released cell's); the official encoder is a "
     "ResNet-50 of fixed widths"),
    ("EntireModel.unsuper_loss (semi_ce_loss)", "semi_ce_loss on the logits padded to 21 classes with a logit "
     "1e4 below the least (softmax 0)", "semi_ce_loss pads its one-hot to VOC's 21 classes (losses.py 72-76) and "
     "multiplies it with the student's K; padded, its softmaxes, argmax, weights and positive loss are those of the K "
     "classes; its negative loss (which the padding changes) enters only with semi_n_th > 0, and the scripts set 0"),
    ("VOCDataset.__init__", "the same, then num_classes the study's K", "VOCDataset hard-codes VOC's 21 (voc.py 31), "
     "which the Trainer takes for its assist mask and its mIoU (the mean over 21 classes, 16 of them absent)"),
    ("Trainer.assist_mask_calculate", "the same with topk min(topk, num_classes)",
     "_train_epoch asks the assist teacher's top 7 of VOC's 21 classes; of the study's K < 7 classes torch.topk "
     "raises, and the top 7 hold them all (what the project's assist_combine does)"),
    ("Trainer.update_teachers", "the same with keep_rate the cell's ema_keep_rate",
     "_train_epoch calls it with its default 0.996; the mini study's time rule scales it to the short run (0.9)"),
    ("numpy.int", "int", "removed in NumPy 1.24; cut_mix's rand_bbox_1 casts with it"),
    ("Utils.tensor_board.Tensorboard (as main imported it)", "a board that discards",
     "wandb logging only; wandb and seaborn are not installed: empty stand-ins for the module's imports, never "
     "called"),
    ("Trainer._valid_epoch", "the same function, its Mean_IoU also recorded (x 100)",
     "the per-epoch curve; nothing changed"),
)
PATCHES_OF = {"supervised": PATCHES, "fixmatch": PATCHES, "unimatch": PATCHES, "u2pl": U2PL_PATCHES,
              "augseg": AUGSEG_PATCHES, "psmt": PSMT_PATCHES, **dict.fromkeys(V2, V2_PATCHES)}
#: PS-MT's VOC config (``main.py`` reads it as the dict the Trainer takes)
PSMT_CONFIG = "VocCode/configs/config_deeplab_v3+.json"
#: the classes PS-MT's ``semi_ce_loss`` pads its one-hot to (VOC's)
PSMT_LOSS_CLASSES = 21
#: AugSeg's VOC 1/16 configuration (662 labeled images)
AUGSEG_CONFIG = "exps/zrun_vocs/r50_voc_semi662/config_semi.yaml"
#: U2PL's ``voc_dset`` draws ``10582 - n_sup`` items of each training list (VOC's train_aug has 10582 images)
U2PL_VOC_TRAIN_SIZE = 10582


# ----------------------------------------------------------------------------------------- data


def study_config(data_seed: int) -> StudyConfig:
    """The mini study's dataset instance of ``data_seed`` (``jobs/specs/mini.yaml``'s ``data.options``)."""
    options = dict(yaml.safe_load(MINI_SPEC.read_text())["overrides"]["data.options"])
    return StudyConfig.from_options(DATASET, **{**options, "seed": data_seed})


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
    path less its first character). Returns the three list files."""
    label_folder, list_folder, line = LAYOUTS[layout]
    out = out / LAYOUT_FOLDER.get(layout, "")
    for folder in ("JPEGImages", label_folder):
        (out / folder).mkdir(parents=True, exist_ok=True)
    labeled, unlabeled = labeled_indices(config, partition_counts(config.train_size)[partition])
    evaluated = range(config.val_size if split == "val" else config.tune_size)
    streams = {"labeled": ("train", labeled), "unlabeled": ("train", unlabeled), "val": (split, evaluated)}
    part = partition.replace("/", "_")
    names = LIST_FILES.get(layout, {"labeled": f"{part}/labeled.txt", "unlabeled": f"{part}/unlabeled.txt",
                                    "val": "val.txt"})
    lists = {name: out / list_folder / file.format(labeled=len(labeled)) for name, file in names.items()}
    for split, (stream, indices) in streams.items():
        lines = []
        for index in indices:
            name = f"{stream}_{index:06d}"
            image, label = generate(config, stream, index)
            Image.fromarray(to_uint8(image)).save(out / "JPEGImages" / f"{name}.jpg", quality=100, subsampling=0)
            Image.fromarray(label.numpy().astype(np.uint8), mode="L").save(out / label_folder / f"{name}.png")
            lines.append(line.format(name=name))
        lists[split].parent.mkdir(parents=True, exist_ok=True)
        lists[split].write_text("\n".join(lines) + "\n")
    return lists


def repeated_list(source: Path, length: int, out: Path) -> Path:
    """``source``'s lines repeated and cut to ``length`` into ``out`` (``unimatch.py``'s labeled set, ``ids *=
    ceil(nsample / len(ids))``, for ``supervised.py``: epochs of the same iterations)."""
    lines = source.read_text().splitlines()
    out.write_text("\n".join((lines * -(-length // len(lines)))[:length]) + "\n")
    return out


# ----------------------------------------------------------------------------------------- configuration


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
    :data:`BASE_SIZE_PER_IMAGE`). UniMatch V2's frameworks (:data:`V2`) start
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
    if framework in V2:
        settings.update(v2_settings(framework, settings))
    for key, value in (overrides or {}).items():  # data.options.<name>: one option of the instance, the others kept
        if key.startswith(DATA_OPTION):
            settings["data.options"] = {**settings["data.options"], key.removeprefix(DATA_OPTION): value}
        else:
            settings[key] = value
    if "data.augmentation.base_size" in OFFICIAL_PIPELINES[framework] and \
            "data.augmentation.base_size" not in (overrides or {}):  # the image's size, as VOC's 500 in the official
        image_size = StudyConfig.from_options(DATASET, **settings["data.options"]).image_size
        settings["data.augmentation.base_size"] = round(image_size * BASE_SIZE_PER_IMAGE.get(framework, 1.0))
    settings.update(v2_supervised_epochs(settings) if framework == "supervised_v2" else
                    {} if framework in V2 else official_length_time_settings(framework, settings))
    return released_cell(framework, settings)


def released_cell(framework: str, settings: dict[str, Any]) -> RunConfig:
    """The project's cell of ``framework`` (the study, 1/16, the baseline head, protocol ``released``) with
    ``settings`` as overrides."""
    return compose("paper", framework=PROJECT_FRAMEWORK.get(framework, framework), dataset=DATASET,
                   partition=PARTITION, head="baseline", protocol="released", overrides=settings).config


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
    paper option, which the mini study's ``corrected`` cells leave at 0) scaled alike: 0.5, floored at one epoch."""
    data = StudyConfig.from_options(DATASET, **settings["data.options"])
    unlabeled = data.train_size - partition_counts(data.train_size)[PARTITION]
    run = RunLength.of(steps=settings["schedule.max_steps"],
                       iters_per_epoch=unlabeled // settings["schedule.unlabeled_batch_size"],
                       images_per_step=settings["schedule.batch_size"] + settings["schedule.unlabeled_batch_size"],
                       crop_size=settings["schedule.crop_size"])
    paper = get_framework(framework).paper_options(DATASET, PARTITION)
    if framework == "psmt":
        paper["warmup_epochs"] = released_cell(framework, settings).framework_options["warmup_epochs"]
    return {f"framework_options.{key}": value for key, value in scale_time_settings(paper, run).items()}


def official_cfg(config: RunConfig, data_root: Path, epochs: int) -> dict[str, Any]:
    """The official script's config (``configs/pascal.yaml``'s keys) with the cell's values."""
    return {"dataset": DATASET, "nclass": config.num_classes, "crop_size": config.schedule.crop_size,
            "data_root": str(data_root), "epochs": epochs, "batch_size": config.schedule.batch_size,
            "lr": config.optim.lr, "lr_multi": config.optim.head_lr_mult,
            "criterion": {"name": "CELoss", "kwargs": {"ignore_index": 255}},
            "conf_thresh": float(config.framework_options.get("confidence_threshold", 0.95)),
            "model": "deeplabv3plus", "backbone": config.model.backbone}


def v2_cfg(framework: str, config: RunConfig, data_root: Path, epochs: int) -> dict[str, Any]:
    """UniMatch V2's config (``configs/pascal.yaml``'s keys) with the cell's values: :func:`official_cfg`'s, the
    backbone's name picking ``model_configs``' :data:`V2_MODEL_CONFIG` entry (the network is replaced, its weights
    read from ``./pretrained/<backbone>.pth``), the backbone trained (``lock_backbone: False``, as the cell); for
    ``supervised.py`` the dataset name :data:`V2_SUPERVISED_DATASET` and half the cell's batch, which the script
    doubles. ValueError where the cell's labeled and unlabeled batches differ (both loaders take ``batch_size``)."""
    schedule = config.schedule
    if framework != "supervised_v2" and schedule.batch_size != schedule.unlabeled_batch_size:
        raise ValueError(f"{framework}: the official loaders share one batch_size; the cell has schedule.batch_size "
                         f"{schedule.batch_size} and schedule.unlabeled_batch_size {schedule.unlabeled_batch_size}")
    if framework == "supervised_v2" and schedule.batch_size % 2:
        raise ValueError(f"supervised_v2: supervised.py doubles cfg['batch_size']; the cell's schedule.batch_size "
                         f"{schedule.batch_size} is odd")
    cfg = official_cfg(config, data_root, epochs)
    cfg.update(model="dpt", backbone=f"{config.model.backbone}_{V2_MODEL_CONFIG}",
               lock_backbone=config.model.freeze_backbone)
    if framework == "supervised_v2":
        cfg.update(dataset=V2_SUPERVISED_DATASET, batch_size=schedule.batch_size // 2)
    return cfg


def voc_semi_cfg(config: RunConfig, official: Path, lists: dict[str, Path], epochs: int,
                 save_path: Path) -> dict[str, Any]:
    """The config file ``official`` (U2PL's or AugSeg's VOC ``pascal_semi`` config, from the checkout) with what the
    two share of the cell: its data (the U2PL layout of :func:`export_official_layout`; ``n_sup`` such that both
    training sets are drawn to the unlabeled pool's size, so that an epoch is ``N_u / B`` iterations as on VOC), the
    training crop, epochs, LR, momentum, weight decay, classes and EMA decay; data loaded in the process
    (``workers: 0``, as the project's cell); checkpoints under ``save_path``. Both scripts draw their labeled and
    unlabeled batches of one ``batch_size``."""
    schedule = config.schedule
    if schedule.batch_size != schedule.unlabeled_batch_size:
        raise ValueError(f"{config.framework}: the official loaders share one batch_size; the cell has "
                         f"schedule.batch_size {schedule.batch_size} and schedule.unlabeled_batch_size "
                         f"{schedule.unlabeled_batch_size}")
    cfg = yaml.safe_load(official.read_text())
    dataset, root = cfg["dataset"], str(lists["val"].parents[2])
    for split, data_list in (("train", lists["labeled"]), ("val", lists["val"])):
        dataset[split].update(data_root=root, data_list=str(data_list))
    dataset["train"]["crop"]["size"] = [schedule.crop_size, schedule.crop_size]
    dataset.update(n_sup=U2PL_VOC_TRAIN_SIZE - unlabeled_pool(config), workers=0)
    cfg["trainer"]["epochs"] = epochs
    cfg["trainer"]["optimizer"]["kwargs"].update(lr=config.optim.lr, momentum=config.optim.momentum,
                                                 weight_decay=config.optim.weight_decay)
    cfg["net"].update(num_classes=config.num_classes, ema_decay=config.framework_options["ema_decay"])
    cfg["saver"]["snapshot_dir"] = str(save_path / "checkpoints")
    return cfg


def u2pl_cfg(config: RunConfig, folder: Path, lists: dict[str, Path], epochs: int, save_path: Path) -> dict[str, Any]:
    """U2PL's config for ``train_semi.py``: its VOC 1464 ``experiments/pascal/1464/ours/config.yaml`` from the checkout
    (what the cell shares with it: the transforms, drop_percent, CutMix, the contrastive loss's thresholds, ranks,
    temperature, queries and negatives, loss weights 1, poly power, the criterion) with the cell's settings
    (:func:`voc_semi_cfg`), its batch, the validation's ``center`` crop of the crop size and ``sup_only_epoch``."""
    cfg = voc_semi_cfg(config, folder / U2PL_CONFIG, lists, epochs, save_path)
    cfg["dataset"]["batch_size"] = config.schedule.batch_size
    cfg["dataset"]["val"]["crop"]["size"] = [config.schedule.crop_size, config.schedule.crop_size]
    cfg["trainer"]["sup_only_epoch"] = config.framework_options["sup_only_epochs"]
    return cfg


def augseg_cfg(config: RunConfig, folder: Path, lists: dict[str, Path], epochs: int,
               save_path: Path) -> dict[str, Any]:
    """AugSeg's config for ``train_semi.py``: its VOC 1/16 ``exps/zrun_vocs/r50_voc_semi662/config_semi.yaml`` from
    the checkout (the resize range, flip, its strong views' settings, adaptive CutMix, no supervised-only epoch, poly
    power, the criterion) with the cell's settings (:func:`voc_semi_cfg`), its batch, the resize's base size (the
    cell's ``base_size``, the study's image size, as VOC's 500), the confidence threshold and the unsupervised
    weight; the teacher alone evaluated (``evaluate_student: False``, as the project's side: what both report)."""
    cfg = voc_semi_cfg(config, folder / AUGSEG_CONFIG, lists, epochs, save_path)
    cfg["dataset"]["train"].update(batch_size=config.schedule.batch_size,
                                   resize_base_size=config.data.augmentation["base_size"])
    options = config.framework_options
    cfg["trainer"]["evaluate_student"] = False
    cfg["trainer"]["unsupervised"].update(threshold=options["confidence_threshold"], loss_weight=options["unsup_weight"])
    cfg["saver"]["use_tb"] = False
    return cfg


def psmt_warm_up_epochs(config: RunConfig) -> int:
    """PS-MT's ``--warm_up`` (``config['model']['warm_up_epoch']``) for the cell's warm-up: its warm-up epochs are
    passes over the labeled loader (``len(supervised_loader)``, ``ceil(n_l / B)`` iterations, for each of the three
    networks), the cell's of ``N_u / B`` iterations; as many of them as make the cell's iterations. ValueError where
    they do not divide."""
    data = study_of(config)
    labeled = partition_counts(data.train_size)[PARTITION]
    batch, warm_up = config.schedule.batch_size, config.framework_options["warmup_epochs"]
    iterations, labeled_epoch = warm_up * ((data.train_size - labeled) // batch), -(-labeled // batch)
    if iterations % labeled_epoch:
        raise ValueError(f"psmt: the cell's {warm_up} warm-up epochs ({iterations} iterations) are not a whole number "
                         f"of PS-MT's labeled epochs of {labeled_epoch} iterations")
    return iterations // labeled_epoch


def psmt_cfg(config: RunConfig, folder: Path, data_root: Path, save_path: Path) -> dict[str, Any]:
    """PS-MT's config as ``main.py`` hands it to ``main``: its ``configs/config_deeplab_v3+.json`` from the checkout
    (the ramp-up type, the unsupervised loss, SGD, the Poly schedule, ``gamma`` 0.5, per-epoch validation of the
    whole image) with what ``main.py``'s arguments set (the batch of both loaders, ``warm_up``, the labeled count,
    the LR, the unsupervised weight, the epochs) and the cell's values: crop, base size (600 / 500 of the image, as
    on VOC), momentum, weight decay, ramp-up epochs, the data (``data_dir`` the export, whose ``VOCdevkit/VOC2012``
    holds it) and checkpoints under ``save_path``; data loaded in the process (``num_workers`` 0, as the cell).
    ValueError where the cell's labeled and unlabeled batches differ (``main.py`` sets both from ``--batch_size``)."""
    schedule, options = config.schedule, config.framework_options
    if schedule.batch_size != schedule.unlabeled_batch_size:
        raise ValueError(f"psmt: main.py gives both loaders --batch_size; the cell has schedule.batch_size "
                         f"{schedule.batch_size} and schedule.unlabeled_batch_size {schedule.unlabeled_batch_size}")
    cfg = json.loads((folder / PSMT_CONFIG).read_text())
    data = study_of(config)
    cfg.update(experim_name="psmt", n_labeled_examples=partition_counts(data.train_size)[PARTITION],
               ramp_up=options["rampup_epochs"], unsupervised_w=options["unsup_weight"], n_gpu=1)
    cfg["model"].update(warm_up_epoch=psmt_warm_up_epochs(config), resnet=50)
    cfg["optimizer"]["args"].update(lr=config.optim.lr, momentum=config.optim.momentum,
                                    weight_decay=config.optim.weight_decay)
    for loader in ("train_supervised", "train_unsupervised"):
        cfg[loader].update(data_dir=str(data_root), batch_size=schedule.batch_size, crop_size=schedule.crop_size,
                           base_size=config.data.augmentation["base_size"], num_workers=0)
    cfg["val_loader"].update(data_dir=str(data_root), num_workers=0)
    cfg["trainer"].update(epochs=official_epochs("psmt", config), save_dir=str(save_path))
    return cfg


def psmt_args(config: RunConfig, cfg: dict[str, Any]) -> argparse.Namespace:
    """``main.py``'s arguments as its ``__main__`` leaves them for one process (``--gpus 1``: ``ddp`` False) and its
    scripts set them (``semi_n_th`` 0: no negative learning; ``semi_p_th`` the cell's confidence threshold)."""
    options = config.framework_options
    return argparse.Namespace(nodes=1, batch_size=config.schedule.batch_size, epochs=cfg["trainer"]["epochs"],
                              warm_up=cfg["model"]["warm_up_epoch"], labeled_examples=cfg["n_labeled_examples"],
                              learning_rate=config.optim.lr, gpus=1, gcloud=False, local_rank=-1,
                              architecture="deeplabv3+", backbone=50, ddp=False, dgx=False,
                              semi_p_th=options["confidence_threshold"], semi_n_th=0.0,
                              unsup_weight=options["unsup_weight"], world_size=1)


# ----------------------------------------------------------------------------------------- the official run


class OfficialInterface(nn.Module):
    """The project's segmentor behind the official ``DeepLabV3Plus`` interface: ``backbone`` (its encoder, for the
    optimiser's groups), ``forward(x)`` -> logits ``[B, K, H, W]`` and ``forward(x, need_fp=True)`` -> (clean,
    feature-perturbed) logits (:meth:`npsemiseg.models.Segmentor.forward_feature_perturbed`, UniMatch's
    ``model/semseg/deeplabv3plus.py`` 38-50, golden-checked), upsampled bilinearly with ``align_corners=True`` as the
    official model. Its input is normalised with ImageNet's mean and std (the official loader's); the project's model
    normalises inside, so it gets the image back in [0, 1]."""

    def __init__(self, student: nn.Module, feature_dropout: float = 0.5) -> None:
        super().__init__()
        self.student, self.feature_dropout = student, feature_dropout
        self.backbone = student.backbone
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: Tensor, need_fp: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        images, size = x * self.std + self.mean, x.shape[-2:]
        if need_fp:
            clean, perturbed = self.student.forward_feature_perturbed(images, dropout=self.feature_dropout)
            return (upsample_logits(clean.head.logits, size, align_corners=True)[0],
                    upsample_logits(perturbed.head.logits, size, align_corners=True)[0])
        return upsample_logits(self.student(images).head.logits, size, align_corners=True)[0]


class U2PLInterface(OfficialInterface):
    """The project's U2PL segmentor behind U2PL's ``ModelBuilder``: ``encoder`` (its backbone: the optimiser's group
    at ``lr``), ``decoder`` (its decoder, classifier head and representation head, what U2PL's decoder holds: the
    group at ``lr x 10``) and ``forward(x)`` -> ``{"pred": logits [B, K, h, w], "rep": representation [B, E, h, w]}``
    at feature resolution, as U2PL's decoder returns them (its loop upsamples ``pred`` with ``align_corners=True``).
    Input normalised with ImageNet's mean and std as :class:`OfficialInterface`'s (U2PL's ``Normalize`` of 0-255
    images with the same values x 255)."""

    def __init__(self, student: nn.Module) -> None:
        super().__init__(student)
        self.encoder = student.backbone
        self.decoder = nn.ModuleList([student.decoder, student.head, student.representation_head])

    def forward(self, x: Tensor) -> dict[str, Tensor]:  # type: ignore[override]
        output = self.student(x * self.std + self.mean)
        return {"pred": output.head.logits[0], "rep": output.representation}


class AugSegInterface(OfficialInterface):
    """The project's AugSeg segmentor behind AugSeg's ``ModelBuilder``: ``encoder`` (its backbone: the optimiser's
    group at ``lr``), ``decoder`` (its decoder and classifier head: at ``lr x 10``) and ``forward(x)`` -> (logits
    upsampled to the input with ``align_corners=True``, None: no aux head), as AugSeg's model returns them. Its
    feature dropout (``flag_use_fdrop``) is never asked for by ``train_semi.py``; asked, it raises."""

    def __init__(self, student: nn.Module) -> None:
        super().__init__(student)
        self.encoder = student.backbone
        self.decoder = nn.ModuleList([student.decoder, student.head])

    def forward(self, x: Tensor, flag_use_fdrop: bool = False) -> tuple[Tensor, None]:  # type: ignore[override]
        if flag_use_fdrop:
            raise NotImplementedError("AugSegInterface: flag_use_fdrop (AugSeg's feature dropout) is not mapped")
        return super().forward(x), None


class DPTInterface(OfficialInterface):
    """The project's ViT + DPT segmentor behind UniMatch V2's ``DPT`` (``model/semseg/dpt.py``): ``backbone`` (its ViT:
    the optimiser's group at ``lr``, what ``./pretrained/<backbone>.pth`` is loaded into), ``head`` (its DPT decoder and
    class head: the parameters named without ``backbone``, at ``lr x lr_multi``), :meth:`lock_backbone` and
    ``forward(x, comp_drop=False)`` -> logits at the input's size (``align_corners=True``, as the official upsampling to
    the patch grid x 14 of an input whose sides are multiples of 14); ``comp_drop=True``: complementary channel dropout
    over the pairs ``(i, B / 2 + i)`` with ``kept_fraction`` of them whole (the official ``dropout_prob`` 0.5), by
    :func:`npsemiseg.frameworks.unimatch_v2.complementary_pass`, the project's strong pass (golden-checked against the
    official ``DPT.forward``)."""

    def __init__(self, student: nn.Module, kept_fraction: float = 0.5) -> None:
        super().__init__(student)
        self.kept_fraction = kept_fraction
        self.head = nn.ModuleList([student.decoder, student.head])

    def lock_backbone(self) -> None:
        for parameter in self.backbone.parameters():
            parameter.requires_grad = False

    def draw_masks(self, pairs: int, widths: list[int], device: torch.device) -> list[Tensor]:
        return complementary_masks(pairs, widths, kept_fraction=self.kept_fraction, device=device)

    def forward(self, x: Tensor, comp_drop: bool = False) -> Tensor:  # type: ignore[override]
        if not comp_drop:
            return super().forward(x)
        output = complementary_pass(self.student, x * self.std + self.mean, self.draw_masks)
        return upsample_logits(output.logits, x.shape[-2:], align_corners=True)[0]


def initial_networks(config: RunConfig) -> dict[str, nn.Module]:
    """The project's networks of ``config`` (``student`` and its teachers by name, if any) with the initial weights its run
    starts from (seeded as ``npsemiseg.training.setup`` seeds it; the pretrained backbone loaded by the model's
    construction)."""
    torch.manual_seed(derive_seed(config.seed, "model"))
    framework = build_framework(config)
    teachers = getattr(framework, "teachers", {})
    return {"student": unwrap(framework.student), **{name: unwrap(t) for name, t in teachers.items()}}


def initial_network(config: RunConfig) -> nn.Module:
    """The project's student of ``config`` with the initial weights its run starts from (:func:`initial_networks`)."""
    return initial_networks(config)["student"]


def psmt_golden() -> types.ModuleType:
    """``tests/golden/record_psmt_step_golden.py``: how the project's network takes the place of PS-MT's encoder and
    decoder (``Encoder``, ``Upsample``, ``shell``)."""
    folder = str(ROOT / "tests" / "golden")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("record_psmt_step_golden")


def psmt_entire_model(networks: dict[str, nn.Module], crop: list[int], entire_model: type,
                      encoder_decoder: types.ModuleType, semi_ce_loss: Callable[..., Any]) -> Callable[..., nn.Module]:
    """PS-MT's ``EntireModel(num_classes, config, sup_loss, cons_w_unsup, ignore_index, ...)`` (as ``main`` calls
    it) holding copies of ``networks`` (``student``, ``teacher1``, ``teacher2``, trainable as the official ones are
    built): each the golden recorder's ``Encoder`` (backbone + decoder: ``business_layer`` the decoder, what
    ``BaseTrainer`` groups with the backbone) and an official ``DecoderNetwork`` (``VATDecoderNetwork`` for the
    student) whose ``upsample`` is the recorder's ``Upsample`` of the classifier head (``business_layer``); the
    official ``forward``, losses (``unsuper_loss`` :func:`padded_classes` of ``semi_ce_loss``) and ``cons_w_unsup``."""
    golden = psmt_golden()

    def build(num_classes: int, config: dict[str, Any], sup_loss: Callable[..., Any] | None = None,
              cons_w_unsup: Any = None, ignore_index: int | None = None, **_: Any) -> nn.Module:
        parts: dict[str, nn.Module] = {}
        for suffix, name, decoder in (("1", "teacher1", encoder_decoder.DecoderNetwork),
                                      ("2", "teacher2", encoder_decoder.DecoderNetwork),
                                      ("_s", "student", encoder_decoder.VATDecoderNetwork)):
            network = copy.deepcopy(networks[name]).requires_grad_(True)
            encoder = golden.Encoder(network)
            encoder.business_layer = [encoder.decoder]
            head = golden.shell(decoder, upsample=golden.Upsample(network.head, crop))
            head.business_layer = [head.upsample.head]
            parts.update({f"encoder{suffix}": encoder, f"decoder{suffix}": head})
        model = golden.shell(entire_model, **parts)
        model.mode = "semi" if config["semi"] else "sup"
        model.sup_loss, model.ignore_index, model.unsup_loss_w = sup_loss, ignore_index, cons_w_unsup
        model.unsuper_loss = padded_classes(semi_ce_loss, PSMT_LOSS_CLASSES)
        return model
    return build


def padded_classes(loss: Callable[..., Any], classes: int) -> Callable[..., Any]:
    """``loss(inputs=..., targets=..., **kw)`` on logits ``[B, K, H, W]`` padded to ``classes`` channels, each padded
    logit 1e4 below the tensor's least (its softmax exactly 0: softmaxes, argmax and cross-entropy of the K classes
    unchanged)."""
    def call(inputs: Tensor, targets: Tensor, **kwargs: Any) -> Any:
        def pad(logits: Tensor) -> Tensor:
            shape = (logits.shape[0], classes - logits.shape[1], *logits.shape[2:])
            return torch.cat([logits, logits.new_full(shape, float(logits.detach().min()) - 1e4)], dim=1)
        return loss(inputs=pad(inputs), targets=pad(targets), **kwargs)
    return call


def with_classes(init: Callable[..., None], classes: int) -> Callable[..., None]:
    """A dataset's ``__init__`` that sets ``num_classes`` to ``classes`` after ``init``."""
    def call(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.num_classes = classes
    return call


def capped_topk(assist: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """PS-MT's ``Trainer.assist_mask_calculate`` with ``topk`` at most the trainer's ``num_classes``."""
    def call(self: Any, core_predict: Tensor, assist_predict: Tensor, topk: int = 1) -> Tensor:
        return assist(self, core_predict, assist_predict, topk=min(topk, self.num_classes))
    return call


def with_keep_rate(update: Callable[..., None], keep_rate: float) -> Callable[..., None]:
    """PS-MT's ``Trainer.update_teachers`` with ``keep_rate`` (its call site leaves the default 0.996)."""
    def call(self: Any, teacher_encoder: nn.Module, teacher_decoder: nn.Module, **_: Any) -> None:
        update(self, teacher_encoder, teacher_decoder, keep_rate=keep_rate)
    return call


class _DiscardingWriter:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def _cpu_ddp(ddp: type) -> Callable[..., nn.Module]:
    def wrap(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        kwargs.update(device_ids=None, output_device=None)
        return ddp(module, *args, **kwargs)
    return wrap


@contextlib.contextmanager
def patched(attributes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """``setattr(owner, name, value)`` for each, restored after (the names that were missing removed)."""
    missing = object()
    saved = [(owner, name, getattr(owner, name, missing)) for owner, name, _ in attributes]
    for owner, name, value in attributes:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def one_rank_setup(*args: Any, **kwargs: Any) -> tuple[int, int]:
    """The official ``setup_distributed``'s result in this process: a one-rank gloo group (made here), rank 0 of 1."""
    one_process_group(torch.device("cpu"))
    return 0, 1


def recorded(function: Callable[..., Any], *curves: list[float], scale: float = 1.0) -> Callable[..., Any]:
    """``function`` (an official evaluation) unchanged, each result's mIoU (a tuple's first item, a dict's
    ``Mean_IoU``) x ``scale`` also appended to ``curves`` in turn (call ``i`` to ``curves[i % len(curves)]``: a loop
    that evaluates the model, then its EMA, every epoch)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        value = result[0] if isinstance(result, tuple) else result["Mean_IoU"] if isinstance(result, dict) else result
        curves[sum(map(len, curves)) % len(curves)].append(float(value) * scale)
        return result
    return call


def answered_load(path: str, state: dict[str, Tensor]) -> Callable[..., Any]:
    """``torch.load`` answering ``path`` (as the script spells it) with ``state``, any other file as itself."""
    load = torch.load

    def call(f: Any, *args: Any, **kwargs: Any) -> Any:
        return state if isinstance(f, str) and os.path.normpath(f) == os.path.normpath(path) else load(f, *args, **kwargs)
    return call


def in_process_loader(*args: Any, **kwargs: Any) -> torch.utils.data.DataLoader:
    """``DataLoader`` with ``num_workers`` 0, whatever the caller asks."""
    return torch.utils.data.DataLoader(*args, **{**kwargs, "num_workers": 0})


@contextlib.contextmanager
def official_process(folder: Path, argv: list[str], writer: str, workdir: Path) -> Iterator[contextlib.ExitStack]:
    """What every official run needs (:data:`CPU_PATCHES`): ``.cuda()`` a no-op, DDP without device ids, no SyncBN
    conversion, the module ``writer`` (``torch.utils.tensorboard``, ``tensorboardX``) a discarding ``SummaryWriter``,
    ``sys.argv`` = ``argv``, ``folder`` imported from, ``workdir`` the working directory, ``LOCAL_RANK`` 0, and the
    process group the script makes destroyed after; yields the stack for the script's own patches."""
    board = types.ModuleType(writer)
    board.SummaryWriter = _DiscardingWriter  # type: ignore[attr-defined]
    parent, _, leaf = writer.rpartition(".")
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched([(sys, "argv", argv), (torch.Tensor, "cuda", lambda self, *a, **k: self),
                                     (nn.Module, "cuda", lambda self, *a, **k: self),
                                     (nn.SyncBatchNorm, "convert_sync_batchnorm", staticmethod(lambda m, *a, **k: m)),
                                     (nn.parallel, "DistributedDataParallel",
                                      _cpu_ddp(nn.parallel.DistributedDataParallel)),
                                     *([(sys.modules[parent], leaf, board)] if parent else [])]))
        sys.modules[writer] = board
        stack.callback(sys.modules.pop, writer, None)
        stack.enter_context(official_imports(folder))
        stack.enter_context(contextlib.chdir(workdir))
        stack.callback(os.environ.pop, "LOCAL_RANK", None)
        os.environ["LOCAL_RANK"] = "0"
        stack.callback(lambda: torch.distributed.is_initialized() and torch.distributed.destroy_process_group())
        yield stack


def run_official(folder: Path, script: str, cfg: dict[str, Any], network: nn.Module, lists: dict[str, Path],
                 save_path: Path, seed: int, class_names: tuple[str, ...], model_class: str = "DeepLabV3Plus",
                 evaluations: int = 1, patches: tuple[tuple[Any, str, Any], ...] = (),
                 module_patches: dict[str, Any] | None = None) -> dict[str, Any]:
    """``main()`` of UniMatch's or UniMatch V2's ``folder/script`` on the exported data (``cfg``, ``lists``) with
    :data:`PATCHES` (``model_class`` the network's class name in the script; V2: :data:`V2_PATCHES`, its ``patches``
    and the script's ``module_patches``): its per-epoch mIoU (``curve``), the best (what it reports,
    ``previous_best``) and the last; with ``evaluations`` 2 per epoch (the model, then its EMA), the EMA's and the
    model's curve (``student_curve``). The official code seeds nothing; ``random``, numpy and torch are seeded with
    ``seed`` before it starts."""
    argv = [script, "--config", str(written_config(cfg, save_path)), "--labeled-id-path", str(lists["labeled"]),
            "--unlabeled-id-path", str(lists["unlabeled"]), "--save-path", str(save_path)]
    curves: list[list[float]] = [[] for _ in range(evaluations)]
    with official_process(folder, argv, "torch.utils.tensorboard", lists["val"].parents[2]) as stack:
        module = importlib.import_module(script.removesuffix(".py"))
        classes = importlib.import_module("util.classes").CLASSES
        stack.enter_context(patched([(module, "setup_distributed", one_rank_setup),
                                     (module, model_class, lambda *args, **kwargs: network),
                                     (module, "evaluate", recorded(module.evaluate, *curves)), *patches,
                                     *[(module, name, value) for name, value in (module_patches or {}).items()]]))
        stack.enter_context(unittest.mock.patch.dict(classes, {cfg["dataset"]: list(class_names)}))
        seed_everything(seed)
        module.main()
    result = {"curve": curves[-1], "best": max(curves[-1]), "last": curves[-1][-1]}
    return result if evaluations == 1 else {**result, "student_curve": curves[0]}


def with_banks(train_function: Callable[..., Any], width: int, queue_sizes: list[int]) -> Callable[..., Any]:
    """U2PL's ``train`` given memory banks ``width`` wide (``main`` makes them 256 wide, before any key is queued)
    and ``queue_sizes`` (per class, background first; ``main``'s 50000 / 30000), in place of ``main``'s own lists,
    which ``main`` hands to every epoch: the banks are replaced once, the queue lengths set every call."""
    def train(*args: Any) -> Any:
        memobank, queue_size = args[-3], args[-1]
        if memobank[0][0].shape[1] != width:
            memobank[:] = [[torch.zeros(0, width)] for _ in memobank]
        queue_size[:] = queue_sizes
        return train_function(*args)
    return train


def written_config(cfg: dict[str, Any], save_path: Path) -> Path:
    """``cfg`` as ``save_path/config.yaml`` (the folder made), the file the official script reads."""
    save_path.mkdir(parents=True, exist_ok=True)
    config_file = save_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    return config_file


@contextlib.contextmanager
def voc_semi_process(folder: Path, argv: list[str], writer: str, save_path: Path) -> Iterator[contextlib.ExitStack]:
    """:func:`official_process` for U2PL's and AugSeg's ``train_semi.py`` (whose helpers import ``skimage`` and whose
    ``train`` calls the DataLoader iterator's ``next()``), the root logger's handlers left as they were (AugSeg's
    logging adds a file handler to it)."""
    iterator = torch.utils.data.dataloader._BaseDataLoaderIter
    handlers = list(logging.root.handlers)
    with official_process(folder, argv, writer, save_path) as stack:
        stack.callback(lambda: [logging.root.removeHandler(h) for h in list(logging.root.handlers) if h not in handlers])
        stack.enter_context(stand_ins(U2PL_UNUSED_MODULES))
        stack.enter_context(patched([(iterator, "next", iterator.__next__)]))
        yield stack


def run_official_u2pl(folder: Path, cfg: dict[str, Any], student: nn.Module, queue_sizes: list[int], width: int,
                      save_path: Path, seed: int) -> dict[str, Any]:
    """``main()`` of U2PL's ``train_semi.py`` with ``cfg`` (:func:`u2pl_cfg`) and :data:`U2PL_PATCHES`: the student
    and the teacher :class:`U2PLInterface` of copies of ``student``, the memory banks ``width`` wide with
    ``queue_sizes``; its per-epoch mIoU x 100 (``curve``), the best (what it reports) and the last. ``--seed`` is
    ``seed`` (``main`` seeds ``random``, numpy and torch with it, and its datasets draw their items with it)."""
    argv = ["train_semi.py", "--config", str(written_config(cfg, save_path)), "--seed", str(seed)]
    curve: list[float] = []
    with voc_semi_process(folder, argv, "tensorboardX", save_path) as stack:
        stack.enter_context(patched([(collections, "Iterable", collections.abc.Iterable)]))
        module = importlib.import_module("train_semi")
        stack.enter_context(patched([(module, "setup_distributed", one_rank_setup),
                                     (module, "ModelBuilder", lambda net_cfg: U2PLInterface(copy.deepcopy(student))),
                                     (module, "train", with_banks(module.train, width, queue_sizes)),
                                     (module, "validate", recorded(module.validate, curve, scale=100.0))]))
        seed_everything(seed)
        module.main()
    return {"curve": curve, "best": max(curve), "last": curve[-1]}


class Numpy1Uint8(np.uint8):
    """``np.uint8(x)`` as NumPy 1 computes it for a Python number out of range: wrapped modulo 256 (a C cast of its
    integer part), where NumPy 2 raises; anything else as ``np.uint8``."""

    def __new__(cls, value: Any = 0) -> np.uint8:
        if isinstance(value, int | float):
            value = int(value) % 256
        return np.uint8(value)


def numpy1_uint8() -> types.ModuleType:
    """numpy with :class:`Numpy1Uint8` as ``uint8`` (what AugSeg's ``augs_TIBA`` gets as ``np``)."""
    compat = types.ModuleType("numpy")
    compat.__dict__.update(np.__dict__)
    compat.uint8 = Numpy1Uint8  # type: ignore[attr-defined]
    return compat


def run_official_augseg(folder: Path, cfg: dict[str, Any], student: nn.Module, save_path: Path,
                        seed: int) -> dict[str, Any]:
    """``main(args)`` of AugSeg's ``train_semi.py`` with ``cfg`` (:func:`augseg_cfg`), ``--seed`` ``seed`` (``main``
    seeds ``random``, numpy and torch with it) and :data:`AUGSEG_PATCHES`: the student and the teacher
    :class:`AugSegInterface` of copies of ``student``; its per-epoch teacher mIoU x 100 (``curve``), the best (what it
    reports, ``Best-EMA``) and the last."""
    args = argparse.Namespace(config=str(written_config(cfg, save_path)), local_rank=0, seed=seed, port=None)
    curve: list[float] = []
    with voc_semi_process(folder, ["train_semi.py"], "torch.utils.tensorboard", save_path) as stack:
        module = importlib.import_module("train_semi")
        stack.enter_context(patched([(module, "setup_distributed", one_rank_setup),
                                     (sys.modules["augseg.dataset.augs_TIBA"], "np", numpy1_uint8()),
                                     (module, "ModelBuilder", lambda net_cfg: AugSegInterface(copy.deepcopy(student))),
                                     (module, "validate", recorded(module.validate, curve, scale=100.0))]))
        seed_everything(seed)
        module.main(args)
    return {"curve": curve, "best": max(curve), "last": curve[-1]}


def run_official_psmt(folder: Path, config: RunConfig, data_root: Path, save_path: Path) -> dict[str, Any]:
    """``main(-1, 1, config, args)`` of PS-MT's ``VocCode/main.py`` (what its ``__main__`` calls with one GPU: no
    DDP) with :func:`psmt_cfg`, :func:`psmt_args` and :data:`PSMT_PATCHES`, in the export's ``VOCdevkit/VOC2012``
    (``data_root``'s; its lists are read from there): its warm-up, then its semi-supervised epochs, each evaluated;
    its per-epoch mIoU x 100 (``curve``), the best and the last. ``main`` seeds ``random`` and torch with 42 itself
    (numpy, which CutMix draws from, is seeded here with the seed)."""
    networks = initial_networks(config)
    cfg = psmt_cfg(config, folder, data_root, save_path)
    args, curve = psmt_args(config, cfg), []
    with official_process(folder / "VocCode", ["main.py"], "wandb", data_root / LAYOUT_FOLDER["psmt"]) as stack:
        stack.enter_context(stand_ins({"seaborn": ()}))
        module = importlib.import_module("main")
        trainer, voc = sys.modules["train"].Trainer, sys.modules["DataLoader.voc"].VOCDataset
        build = psmt_entire_model(networks, [config.schedule.crop_size] * 2, module.model_deep,
                                  sys.modules["Model.Deeplabv3_plus.encoder_decoder"],
                                  sys.modules["Utils.losses"].semi_ce_loss)
        stack.enter_context(patched([
            (module, "model_deep", build), (module, "Tensorboard", _DiscardingWriter), (np, "int", int),
            (voc, "__init__", with_classes(voc.__init__, config.num_classes)),
            (trainer, "assist_mask_calculate", capped_topk(trainer.assist_mask_calculate)),
            (trainer, "update_teachers", with_keep_rate(trainer.update_teachers,
                                                        config.framework_options["ema_keep_rate"])),
            (trainer, "_valid_epoch", recorded(trainer._valid_epoch, curve, scale=100.0))]))
        seed_everything(config.seed)
        module.main(-1, 1, cfg, args)
    return {"curve": curve, "best": max(curve), "last": curve[-1]}


# ----------------------------------------------------------------------------------------- one seed


def project_run(config: RunConfig) -> dict[str, Any]:
    """The project's cell: its per-epoch mIoU x 100 (``curve``), the reported (best) and the last."""
    result = train(config)
    per_step: dict[float, float] = {}
    for evaluation in result.history:  # the last epoch's evaluation and the final one are of the same weights
        per_step.setdefault(evaluation["step"], 100.0 * evaluation["miou"])
    return {"curve": list(per_step.values()),
            "best": 100.0 * result.metrics["best/miou"], "last": 100.0 * result.metrics["last/miou"],
            "seconds": result.seconds}


def study_of(config: RunConfig) -> StudyConfig:
    """The dataset instance of ``config`` (its ``data.options``)."""
    return StudyConfig.from_options(DATASET, **config.data.options)


def unlabeled_pool(config: RunConfig) -> int:
    """The unlabeled images of ``config``'s dataset instance at :data:`PARTITION` (what the export's unlabeled list
    holds): the official loops' ``N_u``."""
    data = study_of(config)
    return data.train_size - partition_counts(data.train_size)[PARTITION]


def official_epoch_items(framework: str, config: RunConfig) -> int:
    """The items of one official epoch of ``framework``: ``N_u`` (:func:`unlabeled_pool`); UniMatch V2's
    ``supervised.py``: the labeled list's repeated length (:func:`v2_supervised_items`)."""
    unlabeled = unlabeled_pool(config)
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


def official_run(folder: Path, framework: str, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """``framework``'s official script on the export ``lists`` (its layout, :data:`LAYOUT`) with ``config``'s settings
    and initial network, epochs of ``N_u / B`` iterations (:func:`run_official`, :func:`run_official_u2pl`,
    :func:`run_official_augseg`, :func:`official_v2_run`)."""
    if framework in V2:
        return official_v2_run(folder, framework, config, lists, save_path)
    if framework == "psmt":
        return run_official_psmt(folder, config, lists["val"].parents[5], save_path)
    epochs = official_epochs(framework, config)
    if framework == "u2pl":
        options = config.framework_options
        queues = [options["background_queue_size"]] + [options["queue_size"]] * (config.num_classes - 1)
        return run_official_u2pl(folder, u2pl_cfg(config, folder, lists, epochs, save_path), initial_network(config),
                                 queues, config.model.options.get("representation_dim", 256), save_path, config.seed)
    if framework == "augseg":
        return run_official_augseg(folder, augseg_cfg(config, folder, lists, epochs, save_path),
                                   initial_network(config), save_path, config.seed)
    run_lists = dict(lists)
    if framework == "supervised":
        run_lists["labeled"] = repeated_list(lists["labeled"], unlabeled_pool(config),
                                             save_path.parent / "labeled_repeated.txt")
    cfg = official_cfg(config, lists["val"].parents[2], epochs)
    return run_official(folder, OFFICIAL[framework][1], cfg, OfficialInterface(initial_network(config)), run_lists,
                        save_path, config.seed, study_of(config).family_spec.class_names)


def official_v2_run(folder: Path, framework: str, config: RunConfig, lists: dict[str, Path],
                    save_path: Path) -> dict[str, Any]:
    """UniMatch V2's ``framework`` script (:func:`run_official` with :data:`V2_PATCHES`) on the export ``lists`` with
    ``config``'s settings (:func:`v2_cfg`) and initial network (:class:`DPTInterface`), its backbone's state dict
    what ``./pretrained/<backbone>.pth`` gives: epochs of ``N_u / B`` iterations (``supervised.py``: of
    :func:`v2_supervised_items` / B, the labeled list repeated to that length beforehand). Reported: the EMA's curve
    and best (``unimatch_v2.py``, ``fixmatch.py``: the EMA is what the project's cell evaluates and what the
    published numbers are), the model's beside it (``student_curve``); ``supervised.py``'s model."""
    run_lists = dict(lists)
    if framework == "supervised_v2":
        run_lists["labeled"] = repeated_list(lists["labeled"], official_epoch_items(framework, config),
                                             save_path.parent / "labeled_repeated_v2.txt")
    cfg = v2_cfg(framework, config, lists["val"].parents[2], epochs=official_epochs(framework, config))
    network = DPTInterface(initial_network(config), config.framework_options.get("comp_drop_kept", 0.5))
    pretrained = answered_load(f"./pretrained/{cfg['backbone']}.pth", copy.deepcopy(network.backbone.state_dict()))
    return run_official(folder, OFFICIAL[framework][1], cfg, network, run_lists, save_path, config.seed,
                        study_of(config).family_spec.class_names, model_class="DPT",
                        evaluations=1 if framework == "supervised_v2" else 2, patches=((torch, "load", pretrained),),
                        module_patches={"DataLoader": in_process_loader})


def one_framework(folder: Path, framework: str, data_seed: int, seed: int, lists: dict[str, Path],
                  work: Path, steps: int | None = None, sides: tuple[str, ...] = SIDES,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``sides`` (official, project) of ``framework`` at ``seed`` (``steps``: the iterations, default the mini
    study's; ``overrides``: :func:`project_config`'s), each timed; a side not run has None. ``lists``: the export in
    the framework's layout (:data:`LAYOUT`)."""
    config = project_config(framework, data_seed, seed, steps, overrides)
    results: dict[str, dict[str, Any] | None] = dict.fromkeys(SIDES)
    if "official" in sides:
        started = time.perf_counter()
        results["official"] = official_run(folder, framework, config, lists, work / f"{framework}_{seed}")
        results["official"]["seconds"] = time.perf_counter() - started
    if "project" in sides:
        results["project"] = project_run(config)
    row: dict[str, Any] = {"seed": seed}
    for side, result in results.items():
        row.update({f"{side}_miou": result and result["best"], f"{side}_last_miou": result and result["last"],
                    f"{side}_curve": result and result["curve"],
                    f"{side}_seconds": result and round(result["seconds"], 1)})
        if result and "student_curve" in result:  # UniMatch V2's loops evaluate the model beside its EMA
            row.update({f"{side}_student_curve": result["student_curve"],
                        f"{side}_student_miou": max(result["student_curve"])})
    print(f"{framework} seed {seed}: " + ", ".join(
        f"{side} {r['best']:.2f} (last {r['last']:.2f}, {r['seconds']:.0f} s)" for side, r in results.items() if r),
        flush=True)
    return row


# ----------------------------------------------------------------------------------------- verdict


def equivalence(official: list[float], project: list[float], margin: float = 1.0) -> dict[str, float]:
    """Two one-sided tests (Welch) that the mean mIoU of ``project`` minus ``official`` lies within ``±margin``:
    ``p`` the larger of the two one-sided p-values (equivalent at level alpha when ``p < alpha``), with the mean
    difference and its 90 % confidence interval (Welch). Needs two values per side."""
    a, b = np.asarray(project, dtype=float), np.asarray(official, dtype=float)
    if min(a.size, b.size) < 2:
        raise ValueError(f"equivalence: expected at least 2 runs per side, got {b.size} official and {a.size} project")
    lower = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater")
    upper = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less")
    diff = stats.ttest_ind(a, b, equal_var=False)
    interval = diff.confidence_interval(0.90)
    return {"margin": margin, "difference": float(a.mean() - b.mean()), "p": float(max(lower.pvalue, upper.pvalue)),
            "ci90_low": float(interval.low), "ci90_high": float(interval.high)}


# ----------------------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, help="folder of <owner>+<repo> checkouts")
    parser.add_argument("--framework", choices=sorted(OFFICIAL))
    parser.add_argument("--data-seed", type=int, default=0, help="the study dataset's instance")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--no-supervised", action="store_true", help="leave the supervised reference out")
    parser.add_argument("--steps", type=int, default=None,
                        help="iterations per run, a multiple of the epoch's (default: the mini study's 960)")
    parser.add_argument("--side", choices=SIDES, default=None,
                        help="run one side only (the sides of a seed in parallel processes; --combine joins them)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the mini study runs on 1)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of both sides' runs changed from the mini study's (a regime: e.g. "
                             "data.options.image_size=96, schedule.crop_size=96, data.options.train_size=2048; "
                             "VALUE read as YAML); repeat it")
    parser.add_argument("--split", choices=("val", "tune"), default="val",
                        help="the split both sides evaluate: val (what is reported) or tune (what regimes are "
                             "chosen on)")
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                        help="no runs: combine these official_runs.json (seeds run in parallel processes) into --out")
    parser.add_argument("--figure", type=Path, default=None, metavar="PNG",
                        help="no runs: draw the curves of the --combine reports (one per framework) into PNG")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.figure is None and args.out is None:
        parser.error("--out is required (unless --figure)")
    if args.figure is not None and args.combine is None:
        parser.error("--figure needs the reports to draw: --combine JSON [JSON ...]")
    if args.combine is None and (args.official_root is None or args.framework is None):
        parser.error("--official-root and --framework are required (unless --combine)")
    try:
        args.regime = regime(args.settings, args.split)
    except ValueError as error:
        parser.error(str(error))
    return args


def regime(settings: list[str], split: str = "val") -> dict[str, Any]:
    """The overrides of ``--set KEY=VALUE`` (VALUE as YAML) and ``--split``: what both sides' runs change from the
    mini study's settings. ValueError naming a malformed or repeated setting."""
    overrides: dict[str, Any] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip() or key.strip() != key:
            raise ValueError(f"--set: expected KEY=VALUE (e.g. schedule.crop_size=96), got {setting!r}")
        if key in overrides:
            raise ValueError(f"--set: {key} given twice")
        overrides[key] = yaml.safe_load(value)
    if split != "val":
        overrides["evaluation.split"] = split
    return overrides


def is_supervised(framework: str) -> bool:
    """Whether ``framework`` is a supervised reference (:data:`SUPERVISED`'s values)."""
    return framework in SUPERVISED.values()


def panels_of(reports: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The rows of each framework in ``reports`` (``--combine``'s, one per framework), the supervised references
    first (each from the first report holding it: a reference's own, or a framework's ``supervised``), those with
    rows only."""
    panels: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        reference = r["framework"] if is_supervised(r["framework"]) else SUPERVISED.get(r["framework"], "supervised")
        if not panels.get(reference):
            panels[reference] = r["runs"] if is_supervised(r["framework"]) else r["supervised"]
    panels = dict(sorted(panels.items(), key=lambda item: list(SUPERVISED.values()).index(item[0])))
    panels.update({r["framework"]: r["runs"] for r in reports if not is_supervised(r["framework"])})
    return {name: rows for name, rows in panels.items() if rows}


def plot_curves(reports: list[dict[str, Any]], path: Path) -> None:
    """One panel per framework (the supervised reference first, from the first report holding it): the per-epoch
    validation mIoU of each seed, official solid, project dashed, with the seeds' mean curves bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = panels_of(reports)
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), sharey=True, squeeze=False)
    for axis, (name, rows) in zip(axes[0], panels.items()):
        for side, colour, style in (("official", "tab:blue", "-"), ("project", "tab:orange", "--")):
            curves = [r[f"{side}_curve"] for r in rows if r.get(f"{side}_curve")]
            if not curves:
                continue
            for curve in curves:
                axis.plot(range(1, len(curve) + 1), curve, style, color=colour, alpha=0.35, linewidth=0.8)
            length = min(len(c) for c in curves)
            mean = np.mean([c[:length] for c in curves], axis=0)
            axis.plot(range(1, length + 1), mean, style, color=colour, linewidth=2.0,
                      label=f"{side} ({len(curves)} seed{'s' * (len(curves) > 1)}: best {np.mean([max(c) for c in curves]):.1f})")
        axis.set_title(name)
        axis.set_xlabel("epoch (official length)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("validation mIoU x 100")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def seed_everything(seed: int) -> None:
    """Seed ``random``, numpy and torch (the official scripts seed nothing themselves)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def provenance(script: str, argv: list[str]) -> dict[str, str]:
    """A report's date, machine (host, CPUs, load average) and the command that made it."""
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
            "command": f"python benchmarks/{script} " + shlex.join(argv)}


def records(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The figure's numbers, one JSON object each (the docs cite them): every run's best mIoU (``framework``,
    ``side``, ``seed``, ``miou``), each side's mean difference of a framework from supervised
    (``minus_supervised``, seeds the two have in common) and each framework's project minus official
    (``project_minus_official`` with the TOST ``p`` at 1.0 mIoU and each side's mean and sample standard deviation
    over the seeds, where two seeds have both sides)."""
    panels = panels_of(reports)
    out: list[dict[str, Any]] = []
    for name, rows in panels.items():
        for row in rows:
            out += [{"framework": name, "side": side, "seed": row["seed"], "miou": round(row[f"{side}_miou"], 2)}
                    for side in SIDES if row.get(f"{side}_miou") is not None]
        both = [r for r in rows if r.get("official_miou") is not None and r.get("project_miou") is not None]
        if len(both) >= 2:
            sides = {side: [r[f"{side}_miou"] for r in both] for side in SIDES}
            test = equivalence(sides["official"], sides["project"])
            out.append({"framework": name, "project_minus_official": round(test["difference"], 2),
                        "p_tost": round(test["p"], 3), "seeds": len(both),
                        **{f"{side}_{stat}": round(float(fn(values)), 2) for side, values in sides.items()
                           for stat, fn in (("mean", np.mean), ("sd", lambda v: np.std(v, ddof=1)))}})
        if is_supervised(name):
            continue
        for side in SIDES:
            mine = {r["seed"]: r[f"{side}_miou"] for r in rows if r.get(f"{side}_miou") is not None}
            reference = {r["seed"]: r[f"{side}_miou"] for r in panels.get(SUPERVISED.get(name, "supervised"), [])
                         if r.get(f"{side}_miou") is not None}
            common = sorted(set(mine) & set(reference))
            if common:
                out.append({"framework": name, "side": side, "seeds": len(common), "minus_supervised": round(
                    float(np.mean([mine[k] - reference[k] for k in common])), 2)})
    return out


def with_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``equivalence`` (:func:`equivalence` of the framework's runs and of the supervised ones, where
    each has two seeds or more)."""
    rows = {"framework": report["runs"], "supervised": report["supervised"]}
    both = {name: [r for r in runs if r.get("official_miou") is not None and r.get("project_miou") is not None]
            for name, runs in rows.items()}
    report["equivalence"] = {name: equivalence([r["official_miou"] for r in runs], [r["project_miou"] for r in runs])
                             for name, runs in both.items() if len(runs) >= 2}
    return report


def combine(paths: list[Path]) -> dict[str, Any]:
    """One report of several (one framework and data seed; their runs and supervised runs by seed, the first
    report's of a seed kept; commands and machines listed)."""
    reports = [json.loads(p.read_text()) for p in paths]
    framework = next((r["framework"] for r in reports if not is_supervised(r["framework"])), reports[0]["framework"])
    if {r["data_seed"] for r in reports} != {reports[0]["data_seed"]}:
        raise ValueError(f"--combine: the reports are of different data seeds: {[r['data_seed'] for r in reports]}")
    regimes = [r.get("regime", {}) for r in reports]
    if any(other != regimes[0] for other in regimes):
        raise ValueError(f"--combine: the reports are of different regimes (--set, --split): {regimes}")
    runs: dict[int, dict] = {}
    supervised: dict[int, dict] = {}

    def add(target: dict[int, dict], row: dict) -> None:  # the sides of a seed may come from different reports
        joined = target.setdefault(row["seed"], {})
        joined.update({k: v for k, v in row.items() if joined.get(k) is None})

    for r in reports:
        for row in r["runs"]:
            add(runs if r["framework"] == framework else supervised, row)
        if not is_supervised(r["framework"]):
            for row in r["supervised"]:
                add(supervised, row)
    combined = {**reports[0], "framework": framework, "runs": [runs[k] for k in sorted(runs)],
                "supervised": [supervised[k] for k in sorted(supervised)],
                "parts": [{k: r[k] for k in ("command", "date", "machine", "seconds")} for r in reports]}
    return with_verdict(combined)


def report_of(args: argparse.Namespace, folder: Path, results: dict[str, list[dict]], seconds: float) -> dict[str, Any]:
    supervised = results.get(SUPERVISED.get(args.framework, "supervised"), [])
    report = {"framework": args.framework, "data_seed": args.data_seed, "regime": args.regime,
              "runs": results.get(args.framework, []), "supervised": supervised,
              "official": {"repository": OFFICIAL[args.framework][0], "script": OFFICIAL[args.framework][1],
                           "folder": str(folder)},
              "patches": [dict(zip(("replaced", "by", "why"), p)) for p in patches_of(frameworks_run(args))],
              **provenance("official_runs.py", args.argv), "seconds": round(seconds, 1)}
    return with_verdict(report)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.figure is not None:
        reports = [json.loads(p.read_text()) for p in args.combine]
        plot_curves(reports, args.figure)
        rows = records(reports)
        args.figure.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"records": rows}
    if args.combine is None:
        try:  # every run's length checked before anything starts
            for framework in frameworks_run(args):
                official_epochs(framework, project_config(framework, args.data_seed, args.seeds[0], args.steps,
                                                          args.regime))
        except ValueError as error:
            sys.exit(f"official_runs.py: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = combine(args.combine) if args.combine is not None else run_all(args)
    (args.out / "official_runs.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("framework", "data_seed", "equivalence")}))
    return report


def frameworks_run(args: argparse.Namespace) -> list[str]:
    """The frameworks a run of ``args`` trains: ``--framework``, then its supervised reference (:data:`SUPERVISED`)
    unless left out."""
    reference = SUPERVISED.get(args.framework, "supervised")
    return [args.framework] + ([] if args.no_supervised or args.framework == reference else [reference])


def patches_of(frameworks: list[str]) -> list[tuple[str, str, str]]:
    """The patches of the official runs of ``frameworks`` (:data:`PATCHES_OF`), each once, in order."""
    return list(dict.fromkeys(patch for framework in frameworks for patch in PATCHES_OF[framework]))


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every run of ``args`` (the framework's seeds, then the supervised reference's), the report rewritten after
    each so that a stopped job keeps what it finished."""
    frameworks = frameworks_run(args)
    folders = {fw: checkout(args.official_root, OFFICIAL[fw][0]) for fw in frameworks}
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    work = args.out / "work"
    data = study_of(project_config(args.framework, args.data_seed, args.seeds[0], args.steps, args.regime))
    exports = {layout: export_official_layout(data, work / ("data" if layout == "unimatch" else f"data_{layout}"),
                                              layout=layout, split=args.split)
               for layout in dict.fromkeys(LAYOUT[fw] for fw in frameworks)}
    results: dict[str, list[dict]] = {fw: [] for fw in frameworks}
    print("patches of the official runs:\n" + "\n".join(f"  {p[0]} -> {p[1]} ({p[2]})" for p in patches_of(frameworks)),
          flush=True)
    for fw in frameworks:
        for seed in args.seeds:
            results[fw].append(one_framework(folders[fw], fw, args.data_seed, seed, exports[LAYOUT[fw]], work,
                                             args.steps, (args.side,) if args.side else SIDES, args.regime))
            report = report_of(args, folders[args.framework], results, time.perf_counter() - started)
            (args.out / "official_runs.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()

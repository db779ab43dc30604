"""UniMatch V2's ``unimatch_v2.py``, ``fixmatch.py`` and ``supervised.py`` (LiheYoung/UniMatch-V2) on the mini
study's ViT: their patches (:data:`V2_PATCHES`), config (:func:`v2_cfg`) and run (:func:`official_v2_run`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from npsemiseg.config import RunConfig

from official.networks import DPTInterface, initial_network
from official.patching import CPU_PATCHES, ONE_RANK_PATCH, TENSORBOARD_PATCH, answered_load, in_process_loader, run_official
from official.study import (OFFICIAL, V2_SUPERVISED_DATASET, official_cfg, official_epoch_items, official_epochs,
                            repeated_list, study_of)

#: the official ViT configs' entry the replaced DPT's arguments come from (``model_configs[cfg['backbone'].split('_')
#: [-1]]``, unimatch_v2.py 53-59); the network is the project's whatever the entry
V2_MODEL_CONFIG = "small"
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

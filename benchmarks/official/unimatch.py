"""UniMatch's ``supervised.py``, ``fixmatch.py`` and ``unimatch.py`` (LiheYoung/UniMatch): their patches
(:data:`PATCHES`) and their run (:func:`official_unimatch_run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npsemiseg.config import RunConfig

from official.networks import OfficialInterface, initial_network
from official.patching import CPU_PATCHES, ONE_RANK_PATCH, TENSORBOARD_PATCH, run_official
from official.study import OFFICIAL, official_cfg, official_epochs, repeated_list, study_of, unlabeled_pool

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


def official_unimatch_run(folder: Path, framework: str, config: RunConfig, lists: dict[str, Path],
                          save_path: Path) -> dict[str, Any]:
    """UniMatch's ``framework`` script (:func:`official.patching.run_official` with :data:`PATCHES`) on the export
    ``lists`` with ``config``'s settings (:func:`official.study.official_cfg`) and initial network
    (:class:`OfficialInterface`), epochs of ``N_u / B`` iterations (``supervised.py``: the labeled list repeated to
    the unlabeled pool's length beforehand, as ``unimatch.py`` repeats it)."""
    epochs = official_epochs(framework, config)
    run_lists = dict(lists)
    if framework == "supervised":
        run_lists["labeled"] = repeated_list(lists["labeled"], unlabeled_pool(config),
                                             save_path.parent / "labeled_repeated.txt")
    cfg = official_cfg(config, lists["val"].parents[2], epochs)
    return run_official(folder, OFFICIAL[framework][1], cfg, OfficialInterface(initial_network(config)), run_lists,
                        save_path, config.seed, study_of(config).family_spec.class_names)

"""A dataset is one registered class: its paper settings are the presets' values, the frameworks' per-family
tables are read through them, and no code outside the dataset classes branches on a dataset's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npsemiseg.data import DATASETS, dataset_definition, dataset_info, dataset_names
from npsemiseg.data.base import DatasetDef
from npsemiseg.data.settings import (
    CITYSCAPES_SETTINGS,
    UNIMATCH_V2_FRAMEWORKS,
    VOC_SETTINGS,
    PaperSettings,
    Publication,
)
from npsemiseg.frameworks import get_framework
from npsemiseg.presets import Cell, head_schedule

REPO = Path(__file__).resolve().parents[1]



def _branches(text: str) -> int:
    """Comparisons of a registered dataset's name (or of a dataset recipe) with ``==`` / ``!=``."""
    names = "|".join(re.escape(n) for n in dataset_names())
    literal = rf"[\"'](?:{names})[\"']"
    pattern = rf"(?:[=!]=\s*{literal})|(?:{literal}\s*[=!]=)|(?:(?:family|recipe)\s*[=!]=)"
    return len(re.findall(pattern, text))


def test_no_dataset_name_branches_outside_the_dataset_classes():
    """The grep of the issue: ``== "cityscapes"`` and the like live only in ``npsemiseg/data/sets/``; every framework
    asks its dataset's settings object (the last, UniMatch V2, reads its per-dataset configs there too)."""
    found = {}
    for folder in ("npsemiseg", "semiseg_platform", "jobs"):
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith("npsemiseg/data/sets/"):
                continue
            count = _branches(path.read_text())
            if count:
                found[relative] = count
    assert found == {}
    assert _branches('if dataset == "cityscapes":') == 1 and _branches('x = "cityscapes"') == 0  # the grep works


def test_every_dataset_is_a_registered_class_with_consistent_info():
    for name in dataset_names():
        definition = dataset_definition(name)
        info = dataset_info(name)
        assert isinstance(definition, type) and issubclass(definition, DatasetDef) and definition.name == name
        assert info.name == name and info.num_classes == len(info.class_names) and info.settings.recipe in ("voc",
                                                                                                             "cityscapes")
        assert info.recipe == info.settings.recipe
    with pytest.raises(ValueError, match=r"dataset: unknown name 'ade21k'"):
        dataset_definition("ade21k")


def test_the_paper_settings_are_the_presets_values():
    """What ``presets._VOC`` / ``_CITYSCAPES`` spelled out before the settings objects, value for value."""
    assert VOC_SETTINGS.values() == {
        "optim": {"lr": 1e-3, "head_lr_mult": 10.0, "momentum": 0.9, "weight_decay": 1e-4, "reference_batch": 12},
        "schedule": {"epochs": 80, "batch_size": 3, "unlabeled_batch_size": 3, "crop_size": 480, "poly_power": 0.9,
                     "epoch_length": "unlabeled", "eval_every_epochs": 1},
        "loss": {"ohem": False}, "model": {"aux_head": False},
        "evaluation": {"mode": "center_crop", "crop_size": 513, "num_samples": 5},
    }
    assert CITYSCAPES_SETTINGS.values() == {
        "optim": {"lr": 5e-3, "head_lr_mult": 1.0, "momentum": 0.9, "weight_decay": 5e-4, "reference_batch": 8},
        "schedule": {"epochs": 200, "batch_size": 2, "unlabeled_batch_size": 2, "crop_size": 580, "poly_power": 0.9,
                     "epoch_length": "unlabeled", "eval_every_epochs": 1},
        "loss": {"ohem": True, "ohem_thresh": 0.7, "ohem_min_kept": 100_000, "aux_weight": 0.4},
        "model": {"aux_head": True}, "evaluation": {"mode": "sliding", "crop_size": 769, "num_samples": 5},
    }
    # the datasets' own settings: the shared values plus what the frameworks' publications set on them
    assert dataset_info("synthetic_cityscapes").settings is dataset_definition("cityscapes").settings
    assert dataset_info("cityscapes").settings.values() == CITYSCAPES_SETTINGS.values()
    for name in ("pascal_classic", "pascal_blender"):
        assert dataset_info(name).settings.values() == VOC_SETTINGS.values()
    assert dataset_info("synthetic_blender").settings is dataset_definition("pascal_blender").settings
    # no ResNet framework's publication leaks into datasets without their own; UniMatch V2's Pascal config is the
    # VOC default (the study, folder and synthetic datasets train UniMatch V2 at it)
    assert dataset_info("study").settings is VOC_SETTINGS and set(VOC_SETTINGS.publications) == set(UNIMATCH_V2_FRAMEWORKS)
    smaller = VOC_SETTINGS.scaled(batch=8, processes=2)
    assert smaller.values()["schedule"]["batch_size"] == 4 and smaller.values()["optim"]["reference_batch"] == 8
    with pytest.raises(ValueError, match="recipe: expected one of"):
        PaperSettings(recipe="ade", crop_size=512, batch=16, lr=4e-3, epochs=40)


#: UniMatch V2's config per dataset, read from the dataset classes: (crop, global batch, epochs, OHEM, evaluation mode)
UNIMATCH_V2 = {
    "pascal_classic": (518, 16, 60, None, "whole"), "pascal_blender": (518, 16, 60, None, "whole"),
    "cityscapes": (798, 8, 180, (0.7, 200_000), "sliding"), "ade20k": (518, 8, 60, None, "whole"),
    "coco": (518, 16, 20, None, "whole"), "study": (518, 16, 60, None, "whole"),
    "synthetic_cityscapes": (798, 8, 180, (0.7, 200_000), "sliding"),
}


@pytest.mark.parametrize("dataset", sorted(UNIMATCH_V2))
def test_unimatch_v2_reads_its_official_config_from_the_dataset(dataset):
    """UniMatch V2 and FixMatch V2 (one repository, one config per dataset) ask the dataset's entry; the source file
    is the config of the dataset's paper (a stand-in: its real dataset's; the study dataset: VOC's default, Pascal)."""
    settings = dataset_info(dataset).settings
    for framework in UNIMATCH_V2_FRAMEWORKS:
        cls = get_framework(framework)
        publication = cls.publication_on(settings)
        assert (publication.crop_size, publication.batch, publication.epochs, publication.ohem, publication.eval_mode) == (
            UNIMATCH_V2[dataset]), framework
        assert publication.lr == 5e-6 and publication.source.startswith("UniMatch-V2 configs/")
        assert cls.own_epochs(dataset_info(dataset), "x") == UNIMATCH_V2[dataset][2]
    real = dataset_info(dataset).paper_dataset
    expected = {"pascal_classic": "pascal", "pascal_blender": "pascal", "study": "pascal"}.get(real, real)
    assert publication.source == f"UniMatch-V2 configs/{expected}.yaml"


def test_unimatch_v2_without_a_dataset_entry_trains_at_the_shared_settings(monkeypatch):
    """The negative case: ADE20K without its UniMatch V2 entry gives UniMatch V2 nothing of its own (the shared
    ResNet settings, as any framework without a publication there); a changed entry reaches the composed cell."""
    from npsemiseg.config import compose

    definition = dataset_definition("ade20k")
    own = {k: v for k, v in definition.settings.publications.items() if k not in UNIMATCH_V2_FRAMEWORKS}
    monkeypatch.setattr(definition, "settings", definition.settings.scaled(publications=own))
    assert get_framework("unimatch_v2").publication_values(definition.settings) == []
    config = compose("paper", framework="unimatch_v2", dataset="ade20k", partition="1/64", head="np").config
    assert (config.model.backbone, config.optim.name, config.schedule.epochs) == ("resnet50", "sgd", 60)
    changed = Publication(448, 32, lr=1e-5, epochs=12, source="elsewhere.yaml")
    monkeypatch.setattr(definition, "settings", definition.settings.scaled(publications={"unimatch_v2": changed}))
    composition = compose("paper", framework="unimatch_v2", dataset="ade20k", partition="1/64", head="np")
    schedule = composition.config.schedule
    assert (schedule.crop_size, schedule.batch_size, schedule.epochs, composition.config.optim.lr) == (448, 8, 12, 1e-5)
    assert "elsewhere.yaml 8" in composition.explain("schedule.epochs")


#: what the frameworks that ask their dataset's settings get, per dataset: (publication, options, epochs of a partition)
MOVED = {
    ("fixmatch", "pascal_classic", "92"): (Publication(321, 8, lr=1e-3, epochs=80), {"confidence_threshold": 0.95}, 80),
    ("unimatch", "cityscapes", "744"): (Publication(801, 8, lr=5e-3, epochs=240), {"confidence_threshold": 0.0}, 240),
    ("mt_cps", "pascal_blender", "662"): (Publication(512, 8, lr=1e-2, epochs=34), {}, 34),
    ("mt_cps", "cityscapes", "186"): (Publication(769, 16), {}, None),
    ("mt", "cityscapes", "186"): (Publication(769, 16), {"sup_only_epochs": 0}, None),
    ("supervised", "pascal_classic", "92"): (Publication(513, 16), {}, None),
    ("psmt", "pascal_classic", "92"): (Publication(512, 32, lr=1e-2, epochs=80), {"unsup_weight": 0.06}, 80),
    ("psmt", "pascal_classic", "366"): (Publication(512, 32, lr=1e-2, epochs=80), {"unsup_weight": 0.6}, 80),
    ("psmt", "pascal_blender", "5291"): (None, {}, 300),
    ("psmt", "cityscapes", "744"): (None, {"unsup_weight": 3.0, "cutmix_boxes": "random_boxes", "eval_teachers": "first"},
                                    450),
    ("psmt", "cityscapes", "186"): (None, None, 320),
    ("u2pl", "pascal_classic", "92"): (Publication(513, 16), {}, None),
    ("u2pl", "cityscapes", "744"): (Publication(769, 16), {"sup_only_epochs": 0}, None),
    ("augseg", "pascal_blender", "662"): (Publication(513, 16), {}, None),
    ("augseg", "cityscapes", "186"): (Publication(800, 16), {"ema_decay": 0.996, "confidence_threshold": 0.0,
                                                            "unsup_weight": 2.0}, None),
    # no publication of these frameworks on ADE20K or COCO: the shared settings (PS-MT's VOC epochs no longer leak)
    ("psmt", "ade20k", "316"): (None, {}, None), ("fixmatch", "coco", "232"): (None, {}, None),
    ("augseg", "ade20k", "316"): (None, {}, None), ("u2pl", "coco", "232"): (None, {}, None),
}


@pytest.mark.parametrize(("framework", "dataset", "partition"), sorted(MOVED))
def test_a_framework_reads_its_values_from_the_dataset_settings(framework, dataset, partition):
    """The values that moved out of the framework classes, read back through ``Framework.publication_on``,
    ``own_epochs`` and the settings' ``options_for``; each would change if its dataset entry were removed."""
    publication, options, epochs = MOVED[(framework, dataset, partition)]
    cls, info = get_framework(framework), dataset_info(dataset)
    if publication is not None:
        assert cls.publication_on(info.settings) == publication
    if options is not None:
        assert info.settings.options_for(framework, partition) == options
    assert cls.own_epochs(info, partition) == epochs
    if dataset in ("ade20k", "coco"):
        assert cls.publication_on(info.settings) is None and cls.shared_epochs(info.settings) == info.settings.epochs


def test_cells_compose_the_moved_values():
    """Composition lays a dataset's options over the framework's defaults, and switch ``psmt_epochs`` reads the
    dataset's publication: PS-MT on ADE20K trains ADE20K's 60 shared epochs (80 before, VOC's leaking in)."""
    from npsemiseg.config import compose

    def cell(framework, dataset, partition, protocol="released", head="np"):
        return compose("paper", framework=framework, dataset=dataset, partition=partition, head=head,
                       protocol=protocol).config

    city = cell("psmt", "cityscapes", "1/4")
    assert (city.schedule.epochs, city.framework_options["cutmix_boxes"], city.framework_options["unsup_weight"]) == (
        450, "random_boxes", 3.0)
    assert cell("psmt", "pascal_blender", "1/2").schedule.epochs == 300
    assert cell("psmt", "ade20k", "1/64").schedule.epochs == 60 and cell("psmt", "coco", "1/512").schedule.epochs == 30
    assert cell("fixmatch", "cityscapes", "1/8").framework_options["confidence_threshold"] == 0.0
    assert cell("mt", "cityscapes", "1/8", "corrected").framework_options["sup_only_epochs"] == 0
    assert cell("mt", "study", "1/16", "corrected").framework_options["sup_only_epochs"] == 1  # U2PL's trainer default
    assert cell("u2pl", "cityscapes", "1/8").framework_options["sup_only_epochs"] == 0
    assert cell("u2pl", "pascal_blender", "1/8").framework_options["sup_only_epochs"] == 1
    augseg = cell("augseg", "cityscapes", "1/8")
    assert (augseg.schedule.epochs, augseg.framework_options["ema_decay"], augseg.framework_options["unsup_weight"]) == (
        240, 0.996, 2.0)
    # AugSeg's NP configs (crop 480, 8 in all) are Pascal's: ADE20K's NP cells train at ADE20K's crop (480 before, the
    # VOC column leaking in), its baseline at the shared batch (AugSeg's VOC publication's 16 before)
    voc_np = cell("augseg", "pascal_classic", "92").schedule
    assert (voc_np.crop_size, voc_np.batch_size) == (480, 2)
    assert cell("augseg", "ade20k", "1/64").schedule.crop_size == 518
    assert cell("augseg", "ade20k", "1/64", head="baseline").schedule.batch_size == 2
    # UniMatch's VOC switch concerns center-crop datasets: ADE20K (evaluated whole) stays whole under corrected
    assert cell("unimatch", "ade20k", "1/64", "corrected").evaluation.mode == "whole"
    assert cell("unimatch", "pascal_classic", "92", "corrected").evaluation.mode == "center_crop"
    assert cell("unimatch", "pascal_classic", "92").evaluation.mode == "whole"


def test_head_schedule_reads_a_registered_dataset_settings(monkeypatch):
    """A dataset's own publication for a framework reaches the baseline head's per_head schedule."""
    definition = dataset_definition("pascal_classic")
    monkeypatch.setattr(definition, "settings",
                        VOC_SETTINGS.scaled(publications={"u2pl": Publication(400, 8, lr=2e-3, epochs=33)}))
    cell = Cell("paper", "u2pl", "pascal_classic", "92", "baseline")
    assert [value for _, value, _ in head_schedule(cell, "per_head")] == [400, 2, 2, 8, 2e-3, 33]
    assert DATASETS.get("pascal_classic") is definition


def test_a_dataset_sets_framework_options_per_partition(monkeypatch):
    """``framework_options`` then ``partition_options`` lie over the framework's ``paper_options`` (what PS-MT's
    per-partition unsupervised weight will move to); a publication's ``partition_epochs`` reach per_head."""
    from npsemiseg.config import cell_config

    definition = dataset_definition("pascal_classic")
    monkeypatch.setattr(definition, "settings", VOC_SETTINGS.scaled(
        framework_options={"psmt": {"unsup_weight": 0.5}}, partition_options={"psmt": {"92": {"unsup_weight": 0.25}}},
        publications={"psmt": Publication(512, 32, lr=1e-2, epochs=80, partition_epochs={"183": 120})}))
    small = cell_config("paper", framework="psmt", dataset="pascal_classic", partition="1/16", head="np")
    larger = cell_config("paper", framework="psmt", dataset="pascal_classic", partition="1/8", head="baseline",
                         **{"schedule.head_settings": "per_head"})
    assert small.framework_options["unsup_weight"] == 0.25 and larger.framework_options["unsup_weight"] == 0.5
    assert larger.schedule.epochs == 120 and larger.schedule.crop_size == 512


def test_psmt_box_scheme_is_named_by_its_boxes_and_old_records_still_read():
    """``cutmix_variant: voc / cityscapes`` became ``cutmix_boxes: beta_box / random_boxes``: a record or a
    parameter written before reads as the new option, and the cell keeps its id (hashed under the old name)."""
    from npsemiseg.config import RunConfig, compose
    from semiseg_platform.tracking.mlflow_names import param_value

    config = compose("paper", framework="psmt", dataset="cityscapes", partition="1/8", head="np").config
    assert config.framework_options["cutmix_boxes"] == "random_boxes"
    hashed = config.identity()["framework_options"]
    assert hashed["cutmix_variant"] == "cityscapes" and "cutmix_boxes" not in hashed
    old = config.model_dump(mode="json")
    old["framework_options"]["cutmix_variant"] = old["framework_options"].pop("cutmix_boxes").replace(
        "random_boxes", "cityscapes")
    again = RunConfig.model_validate(old)
    assert again.framework_options == config.framework_options and again.cell_id == config.cell_id
    assert param_value({"framework_options.cutmix_variant": "voc"}, "framework_options.cutmix_boxes") == "beta_box"
    assert param_value({"framework_options.cutmix_boxes": "random_boxes"}, "framework_options.cutmix_boxes") == "random_boxes"


def test_without_its_dataset_entries_a_framework_falls_back_to_the_shared_settings(monkeypatch):
    """The negative case of the moved values: Cityscapes without its publications, options and epochs gives PS-MT the
    shared 200 epochs, one Beta box and weight 1.5, FixMatch VOC's threshold, AugSeg VOC's options and the shared 200
    epochs, U2PL one supervised-only epoch: nothing is left in the framework classes."""
    from npsemiseg.config import compose

    definition = dataset_definition("cityscapes")
    monkeypatch.setattr(definition, "settings", definition.settings.scaled(publications={}, framework_options={},
                                                                           framework_epochs={}))
    psmt = compose("paper", framework="psmt", dataset="cityscapes", partition="1/4", head="np",
                   protocol="released").config
    assert psmt.schedule.epochs == 200
    assert (psmt.framework_options["cutmix_boxes"], psmt.framework_options["unsup_weight"]) == ("beta_box", 1.5)
    fixmatch = compose("paper", framework="fixmatch", dataset="cityscapes", partition="1/8", head="np").config
    assert fixmatch.framework_options["confidence_threshold"] == 0.95
    augseg = compose("paper", framework="augseg", dataset="cityscapes", partition="1/8", head="baseline").config
    assert augseg.schedule.epochs == 200 and augseg.schedule.crop_size == 580
    assert (augseg.framework_options["ema_decay"], augseg.framework_options["confidence_threshold"]) == (0.999, 0.95)
    u2pl = compose("paper", framework="u2pl", dataset="cityscapes", partition="1/8", head="np").config
    assert u2pl.framework_options["sup_only_epochs"] == 1

"""``npsemiseg/presets_audit.md``: every ``ours`` cell equals the ``paper`` preset's value (corrected protocol,
NP head), and every switch it names exists with the official value as its released value."""

from __future__ import annotations

from pathlib import Path

import pytest

from npsemiseg.config import RunConfig, cell_config
from npsemiseg.config.overrides import parse_scalar
from npsemiseg.presets import Cell, HEAD_SCHEDULE_KEYS, head_schedule
from npsemiseg.protocol import SWITCHES, protocol_framework

AUDIT = Path(__file__).resolve().parents[1] / "npsemiseg" / "presets_audit.md"
PARTITION = {"pascal_classic": "92", "cityscapes": "186", "ade20k": "316", "coco": "232"}


def _rows() -> list[dict[str, str]]:
    lines = [line for line in AUDIT.read_text().splitlines() if line.startswith("| ") and "---" not in line]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[1:]]


def _value(config: RunConfig, key: str):
    node = config.model_dump(mode="json")
    for part in key.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['framework']}-{r['dataset']}-{r['key']}")
def test_audit_row_matches_the_preset(row):
    config = cell_config("paper", framework=row["framework"], dataset=row["dataset"],
                                   partition=PARTITION[row["dataset"]], head="np", protocol="corrected")
    assert _value(config, row["key"]) == parse_scalar(row["ours"].replace("True", "true").replace("False", "false"))
    if row["status"].startswith("switch head_settings") and row["key"] != "schedule.head_settings":
        _check_head_schedule_row(row)
    elif row["status"].startswith("switch "):
        switch = SWITCHES[row["status"].split()[1]]
        assert switch.target == row["key"]
        released = cell_config("paper", framework=row["framework"], dataset=row["dataset"],
                                         partition=PARTITION[row["dataset"]], head="np", protocol="released")
        assert _value(released, row["key"]) == switch.value("released", released.model_dump(mode="json"))


def _check_head_schedule_row(row):
    """A value ``head_settings`` derives: ``released`` gives the official value (first word) for the baseline or
    the NP head, as :func:`head_schedule` derives it, and differs from ``corrected`` there."""
    assert row["key"] in HEAD_SCHEDULE_KEYS
    official = parse_scalar(next(v for k, v in row.items() if k.startswith("official")).split()[0])
    released = {}
    for head in ("baseline", "np"):
        cell = dict(framework=row["framework"], dataset=row["dataset"], partition=PARTITION[row["dataset"]], head=head)
        config = cell_config("paper", **cell, protocol="released")
        released[head] = _value(config, row["key"])
        framework, _ = protocol_framework("released", row["framework"], row["dataset"], head)  # mt: mt_cps
        derived = {key: value for key, value, _ in head_schedule(Cell("paper", **{**cell, "framework": framework},
                                                                      protocol="released"), "per_head")}
        assert released[head] == derived[row["key"]]
    assert official in released.values()
    head = next(h for h, value in released.items() if value == official)
    corrected = cell_config("paper", framework=row["framework"], dataset=row["dataset"],
                                      partition=PARTITION[row["dataset"]], head=head, protocol="corrected")
    assert _value(corrected, row["key"]) != official


def test_audit_covers_every_framework_and_family():
    rows = _rows()
    assert {(r["framework"], r["dataset"]) for r in rows} >= {
        ("u2pl", "pascal_classic"), ("u2pl", "cityscapes"), ("augseg", "pascal_classic"), ("augseg", "cityscapes"),
        ("psmt", "pascal_classic"), ("psmt", "cityscapes"), ("mt", "pascal_classic"),
        ("unimatch", "pascal_classic"), ("unimatch", "cityscapes"), ("fixmatch", "pascal_classic"),
        ("fixmatch", "cityscapes")}

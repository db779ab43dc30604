"""``npsemiseg/presets_audit.md``: every ``ours`` cell equals the ``paper`` preset's value (corrected protocol,
NP head), and every switch it names exists with the official value as its released value."""

from __future__ import annotations

from pathlib import Path

import pytest

from npsemiseg.config import RunConfig
from npsemiseg.config.overrides import parse_scalar
from npsemiseg.protocol import SWITCHES

AUDIT = Path(__file__).resolve().parents[1] / "npsemiseg" / "presets_audit.md"
PARTITION = {"pascal_classic": "92", "cityscapes": "186"}


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
    config = RunConfig.from_preset("paper", framework=row["framework"], dataset=row["dataset"],
                                   partition=PARTITION[row["dataset"]], head="np", protocol="corrected")
    assert _value(config, row["key"]) == parse_scalar(row["ours"].replace("True", "true").replace("False", "false"))
    if row["status"].startswith("switch "):
        switch = SWITCHES[row["status"].split()[1]]
        assert switch.target == row["key"]
        released = RunConfig.from_preset("paper", framework=row["framework"], dataset=row["dataset"],
                                         partition=PARTITION[row["dataset"]], head="np", protocol="released")
        assert _value(released, row["key"]) == switch.value("released", released.model_dump(mode="json"))


def test_audit_covers_every_framework_and_family():
    rows = _rows()
    assert {(r["framework"], r["dataset"]) for r in rows} >= {
        ("u2pl", "pascal_classic"), ("u2pl", "cityscapes"), ("augseg", "pascal_classic"), ("augseg", "cityscapes"),
        ("psmt", "pascal_classic"), ("psmt", "cityscapes"), ("mt", "pascal_classic")}

"""``benchmarks/official_side_by_side.py``: the official loop body as it runs there, and the whole benchmark at a
tiny size.

The integration test needs the official checkouts (never part of the project): it reads the folder holding them
from ``NPSEMISEG_OFFICIAL_ROOT`` (``<owner>+<repo>`` or ``<repo>`` folders, e.g. ``LiheYoung+UniMatch``) and is
skipped, not failed, where that is unset or lacks a checkout (CI has none). The loop-body tests need nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

SCRIPT = '''
import torch

def main():
    total = 0
    for i, (x, y) in enumerate(loader):
        x = x.cuda()
        torch.distributed.barrier()
        total = total + x * y + i
    return total
'''


def test_loop_body_runs_the_scripts_loop_on_the_device_without_the_barrier(tmp_path: Path):
    """``.cuda()`` becomes ``.to(device)``, the barrier goes (with it, this would raise: no process group), ``i``
    starts at ``__step__``; the body's names come from the namespace."""
    side = load_benchmark("official_side_by_side")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    namespace = {"torch": torch, "total": 0, "loader": [(torch.tensor(2.0), 3.0)], "__device__": torch.device("cpu"),
                 "__step__": 7}
    exec(side.loop_body(script), namespace)  # noqa: S102
    assert float(namespace["total"]) == 2.0 * 3.0 + 7 and namespace["i"] == 7


def test_checkout_finds_an_owner_and_repo_folder_in_any_case_and_names_both_places_when_absent(tmp_path: Path):
    """GitHub's names are case-insensitive: ``zhenzhao/AugSeg`` is the checkout ``ZhenZHAO+AugSeg``; ``repo`` alone
    serves too; a missing one is named with both folders looked for."""
    side = load_benchmark("official_side_by_side")
    (tmp_path / "ZhenZHAO+AugSeg").mkdir()
    (tmp_path / "UniMatch").mkdir()
    assert side.checkout(tmp_path, "zhenzhao/AugSeg") == tmp_path / "ZhenZHAO+AugSeg"
    assert side.checkout(tmp_path, "LiheYoung/UniMatch") == tmp_path / "UniMatch"
    with pytest.raises(FileNotFoundError, match=r"no checkout of yyliu01/PS-MT at .*yyliu01\+PS-MT or .*PS-MT"):
        side.checkout(tmp_path, "yyliu01/PS-MT")


def test_loop_body_names_the_script_when_its_loop_is_not_found_once(tmp_path: Path):
    side = load_benchmark("official_side_by_side")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("enumerate(loader)", "loader"))
    with pytest.raises(ValueError, match=r"train\.py: expected one 'for \.\.\. in enumerate\(loader\)' loop, found 0"):
        side.loop_body(script)


def official_root(repository: str) -> Path:
    root = os.environ.get("NPSEMISEG_OFFICIAL_ROOT")
    try:
        if root:
            return load_benchmark("official_side_by_side").checkout(Path(root), repository).parent
    except FileNotFoundError:
        pass
    pytest.skip(f"no official checkout of {repository} (set NPSEMISEG_OFFICIAL_ROOT to the folder holding it)")


@pytest.mark.integration
def test_side_by_side_runs_unimatch_fixmatch_and_u2pl_on_the_same_network_at_a_tiny_size(tmp_path: Path):
    """The four official loop bodies (UniMatch, FixMatch, U2PL, the NP-SemiSeg authors' U2PL with their NP head) and
    the project's steps run on CPU (ResNet-50, crop 32, 2 + 2 images, one timed step each): the two networks give the
    same eval-mode logits before training (a wrong weight copy, e.g. the ASPP projection's blocks left in the
    project's order, gives 4e-3 at this size; for the NP row the representation, the NP query transform and the NP
    decoder on one draw, where the decoder's first convolution left in the project's input order gives 3.3 at crop
    64), times and peaks are measured, the JSON and Markdown are written."""
    root = official_root("LiheYoung/UniMatch")
    official_root("Haochen-Wang409/U2PL")
    official_root("Jianf-Wang/NP-SemiSeg")
    side = load_benchmark("official_side_by_side")
    report = side.main(["--official-root", str(root), "--backbone", "resnet50", "--crop", "32", "--batch", "2",
                        "--steps", "1", "--warmup", "1", "--threads", "1", "--out", str(tmp_path)])
    rows = {row["framework"]: row for row in report["results"]}
    assert set(rows) == {"unimatch", "fixmatch", "u2pl", "u2pl_np"} and rows["u2pl_np"]["head"] == "np"
    for row in rows.values():
        assert "error" not in row, row
        assert row["max_abs_logit_diff"] < 1e-4
        for measured in (row["project"], row["official_side"]):
            assert measured["step_s"] > 0 and measured["peak_mib"] > measured["state_mib"] > 90  # ResNet-50's weights
        assert row["step_ratio"] > 0
    assert json.loads((tmp_path / "side_by_side.json").read_text())["results"][0]["framework"] == "unimatch"
    assert "| unimatch | LiheYoung/UniMatch unimatch.py |" in (tmp_path / "side_by_side.md").read_text()
    assert not torch.distributed.is_initialized()  # U2PL's one-rank group is gone


def test_host_work_table_lists_each_sides_operator_calls_and_reads():
    """``--host-work`` rows: the counts of both sides and their ratio; no table when no side was counted."""
    sbs = load_benchmark("official_side_by_side")
    row = {"framework": "unimatch", "project": {"host_work": {"ops": 3074, "reads": 2}},
           "official_side": {"host_work": {"ops": 2921, "reads": 23}}}
    assert sbs.host_work_lines({"results": [row]})[-1] == "| unimatch | 3074 | 2921 | 1.05 | 2 | 23 |"
    assert sbs.host_work_lines({"results": [{"framework": "u2pl", "error": "x"}]}) == []

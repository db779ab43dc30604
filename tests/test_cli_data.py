"""``npsemiseg data prepare`` then ``npsemiseg data check`` on fixture trees in the real formats (VOC palette
PNGs, SBD ``.mat`` files written with scipy, Cityscapes labelIds): exit 0 only when usable."""

from __future__ import annotations

from test_data_prepare import N, _city_tree, _downloads
from typer.testing import CliRunner

from npsemiseg.data import partition_ids
from semiseg_platform.cli.main import app

runner = CliRunner()


def test_prepare_voc_then_check_is_usable(tmp_path):
    voc, sbd, voc_masks, sbd_masks = _downloads(tmp_path)
    check = ["data", "check", "--dataset", "pascal_classic", "--root", str(voc), "--partition", "1/16",
             "--max-items", str(N)]
    before = runner.invoke(app, check)
    assert before.exit_code == 2 and f"{2 * N} listed labels missing" in before.stderr, before.output
    assert "build it from VOC 2012 and SBD with `npsemiseg data prepare voc`" in before.stderr
    result = runner.invoke(app, ["data", "prepare", "voc", "--voc", str(voc), "--sbd", str(sbd)])
    assert result.exit_code == 0, result.output
    written = len(set(voc_masks) | set(sbd_masks))
    assert f"{written} label files in {voc / 'SegmentationClassAug'} ({written} written now, 0 there before" in result.stdout
    again = runner.invoke(app, ["data", "prepare", "voc", "--voc", str(voc), "--sbd", str(sbd)])
    assert f"(0 written now, {written} there before" in again.stdout  # idempotent
    after = runner.invoke(app, check)
    assert after.exit_code == 0, after.output
    assert "usable" in after.stdout.splitlines()[0] and "NOT" not in after.stdout and after.stderr == ""
    assert "92 (1/16) labeled" in after.stdout


def test_prepare_cityscapes_then_check_names_the_missing_unlabeled_images(tmp_path):
    entries = _city_tree(tmp_path / "cityscapes")
    result = runner.invoke(app, ["data", "prepare", "cityscapes", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"{len(entries)} label files" in result.stdout
    checked = runner.invoke(app, ["data", "check", "--dataset", "cityscapes", "--root", str(tmp_path / "cityscapes"),
                                  "--partition", "186", "--max-items", str(N)])
    # the unlabeled list's images were never written: not usable, the error line counts them with an example
    assert checked.exit_code == 2
    first_unlabeled = partition_ids("cityscapes", "unlabeled", "186")[0]
    assert f"{N} listed images missing, e.g. " in checked.stderr and first_unlabeled in checked.stderr
    assert "<- not usable" in checked.stdout


def test_data_commands_have_help():
    for command in (["data"], ["data", "check"], ["data", "prepare"], ["data", "prepare", "voc"],
                    ["data", "prepare", "cityscapes"]):
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, command
    assert "Check a dataset tree, or prepare VOC" in runner.invoke(app, ["--help"], terminal_width=200).output

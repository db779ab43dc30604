"""Tables and figures built from a real MLflow SQLite store filled with schema-conforming runs."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest
from mlflow import MlflowClient

from semiseg_platform import reports as T

GRID = "grid-a"


def _cell_run(client, experiment_id, *, framework, head, partition, seed=0, miou=None, pavpu=None,
              status="FINISHED", dataset="pascal_classic", grid_id=GRID, protocol=None, metrics=None):
    """A cell run tagged as docs/CONTRACTS.md's tracking schema says; returns its run id."""
    cell_id = f"{framework}-{dataset}-{partition}-{head}-{seed}" + (f"-{protocol}" if protocol else "")
    tags = {
        "npsemiseg.kind": "cell", "framework": framework, "dataset": dataset, "partition": partition,
        "head": head, "head_name": head.split("_")[0] if head.startswith("np") else head,
        "seed": str(seed), "cell_id": cell_id, "grid_id": grid_id,
    }
    if protocol:
        tags["protocol"] = protocol
    run = client.create_run(experiment_id, run_name=f"{framework}/{dataset}/{partition}/{head}", tags=tags)
    for key, value in (("miou", miou), ("pavpu", pavpu), *(metrics or {}).items()):
        if value is not None:
            client.log_metric(run.info.run_id, key, value)
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    return run.info.run_id


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    """One SQLite store for the module (creating one costs seconds); tests use their own experiments."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture(scope="module")
def store(uri):
    """An MLflow store with: every cell of mt/u2pl x baseline/mc_dropout/np x 92/183 on classic VOC,
    u2pl np_mean cells, two seeds for (u2pl, np, 92), a superseded run, a failed-only cell
    (mt, mc_dropout, 183), a missing cell (mt, np, 183) and a run of another grid."""
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("study")
    expected: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    value = 0.40
    for framework in ("mt", "u2pl"):
        for head in ("baseline", "mc_dropout", "np", "np_mean"):
            if head == "np_mean" and framework != "u2pl":
                continue
            for partition in ("92", "183"):
                if (framework, head, partition) in {("mt", "np", "183"), ("mt", "mc_dropout", "183")}:
                    continue
                value += 0.0123
                pair = (round(value, 4), round(value + 0.3, 4))
                _cell_run(client, experiment_id, framework=framework, head=head, partition=partition,
                          miou=pair[0], pavpu=pair[1])
                expected[(framework, head, partition)] = [pair]
    # a second seed of one cell
    _cell_run(client, experiment_id, framework="u2pl", head="np", partition="92", seed=1, miou=0.5711, pavpu=0.8123)
    expected[("u2pl", "np", "92")].append((0.5711, 0.8123))
    # an earlier run of the same cell_id (ended long before): the latest finished run replaces it
    superseded = _cell_run(client, experiment_id, framework="mt", head="baseline", partition="92", miou=0.9,
                           pavpu=0.9, status="RUNNING")
    client.set_terminated(superseded, "FINISHED", end_time=1)
    _cell_run(client, experiment_id, framework="mt", head="mc_dropout", partition="183", status="FAILED")
    _cell_run(client, experiment_id, framework="augseg", head="np", partition="92", miou=0.77, pavpu=0.88,
              grid_id="grid-b")
    return uri, expected


def _cell(table: pd.DataFrame, framework: str, head: str, partition: str) -> pd.Series:
    match = table[(table.framework == framework) & (table["head"] == head) & (table.partition == partition)]
    assert len(match) == 1
    return match.iloc[0]


def test_miou_table_numbers_equal_mlflow_metrics(store):
    uri, expected = store
    tables = T.build_tables(uri, "study", grid_id=GRID)
    table = tables["table1_miou_pascal_classic"]
    # Tables 1-3 keep every framework x head x partition cell, also those without runs
    assert len(table) == len(T.PAPER_FRAMEWORKS) * len(T.PAPER_HEADS) * 4
    assert table.attrs["columns"] == ["1/16 (92)", "1/8 (183)", "1/4 (366)", "1/2 (732)"]
    for (framework, head, partition), pairs in expected.items():
        if head == "np_mean":
            continue
        row = _cell(table, framework, head, partition)
        values = [100 * miou for miou, _ in pairs]
        assert row.status == "ok" and row.n == len(values)
        assert row["mean"] == pytest.approx(statistics.fmean(values), abs=1e-9)
        if len(values) > 1:
            assert row["std"] == pytest.approx(statistics.stdev(values), abs=1e-9)
        else:
            assert math.isnan(row["std"])
    assert _cell(table, "mt", "np", "183").status == "missing"
    assert _cell(table, "mt", "mc_dropout", "183").status == "failed"
    assert _cell(table, "augseg", "np", "92").status == "missing"  # its run belongs to another grid
    assert math.isnan(_cell(table, "mt", "np", "183")["mean"])


def test_all_grids_are_read_without_a_grid_id(store):
    uri, _ = store
    table = T.build_tables(uri, "study")["table1_miou_pascal_classic"]
    assert _cell(table, "augseg", "np", "92")["mean"] == pytest.approx(77.0)


def test_pavpu_and_attention_tables(store):
    uri, expected = store
    tables = T.build_tables(uri, "study", grid_id=GRID)
    assert set(tables) == {"table1_miou_pascal_classic", "table4_pavpu", "table5_attention_miou",
                           "table6_attention_pavpu", "cells"}
    with_reliability = T.with_reliability_tables(tables)
    assert list(with_reliability)[-3:] == ["reliability_pascal_classic_92", "reliability_pascal_classic_183", "cells"]
    pavpu = tables["table4_pavpu"]
    assert pavpu.attrs["columns"] == ["MC Dropout", "NP-SemiSeg"]
    assert list(pavpu["head"][:2]) == ["mc_dropout", "np"]
    row = _cell(pavpu, "u2pl", "mc_dropout", "183")
    assert row["mean"] == pytest.approx(100 * expected[("u2pl", "mc_dropout", "183")][0][1])
    two_seeds = _cell(pavpu, "u2pl", "np", "92")
    assert two_seeds["mean"] == pytest.approx(statistics.fmean(100 * p for _, p in expected[("u2pl", "np", "92")]))
    for name, metric_index in (("table5_attention_miou", 0), ("table6_attention_pavpu", 1)):
        table = tables[name]
        assert table.attrs["columns"] == ["w/o Attention", "w/ Attention"]
        for head in ("np_mean", "np"):
            row = _cell(table, "u2pl", head, "183")
            assert row["mean"] == pytest.approx(100 * expected[("u2pl", head, "183")][0][metric_index])
        assert (table[table.partition.isin(["366", "732"])].status == "missing").all()


def test_writers_keep_layout_and_mark_missing(store, tmp_path):
    uri, expected = store
    tables, written = T.write_report(uri, "study", tmp_path, grid_id=GRID)
    names = {p.name for p in written}
    for stem in ("table1_miou_pascal_classic", "table4_pavpu", "table5_attention_miou", "table6_attention_pavpu"):
        assert {f"{stem}.md", f"{stem}.tex", f"{stem}.csv", f"{stem}.parquet", f"{stem}_layout.csv"} <= names
    assert "uncertainty_time.png" not in names  # no benchmark runs in this store

    markdown = (tmp_path / "table1_miou_pascal_classic.md").read_text()
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert lines[0] == "| Method | 1/16 (92) | 1/8 (183) | 1/4 (366) | 1/2 (732) |"
    by_method = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in lines[2:]}
    u2pl_np = by_method["U2PL w/ NP-SemiSeg"]
    values = [100 * m for m, _ in expected[("u2pl", "np", "92")]]
    assert u2pl_np[0] == f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"
    assert by_method["MT w/ NP-SemiSeg"][1] == T.MISSING_MARK
    assert by_method["MT w/ MC dropout"][1] == f"{T.MISSING_MARK} (failed)"
    assert by_method["MT"][0] == f"{100 * expected[('mt', 'baseline', '92')][0][0]:.2f}"

    latex = (tmp_path / "table4_pavpu.tex").read_text()
    assert "\\multirow{4}{*}{VOC (\\it classic)}" in latex and "\\toprule" in latex

    parquet = pd.read_parquet(tmp_path / "table1_miou_pascal_classic.parquet")
    pd.testing.assert_frame_equal(parquet, pd.DataFrame(tables["table1_miou_pascal_classic"]), check_like=False)
    layout_csv = pd.read_csv(tmp_path / "table4_pavpu_layout.csv", keep_default_na=False)
    assert list(layout_csv.columns) == ["Dataset", "Label Amount", "MC Dropout", "NP-SemiSeg"]
    assert "tables.md" in names and "Table 4" in (tmp_path / "tables.md").read_text()


def test_stand_in_datasets_take_their_real_datasets_place(uri):
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("smoke")
    for dataset, partition in (("synthetic_cityscapes", "186"), ("synthetic_voc", "92")):
        _cell_run(client, experiment_id, framework="u2pl", head="np", partition=partition, dataset=dataset,
                  miou=0.25, pavpu=0.5)
    tables = T.build_tables(uri, "smoke")
    assert [n for n in tables if n.startswith("table")] == [
        "table1_miou_synthetic_voc", "table3_miou_synthetic_cityscapes", "table4_pavpu",
        "table5_attention_miou", "table6_attention_pavpu"]
    # Tables 4-6 list Cityscapes first, as the paper does
    assert tables["table4_pavpu"]["dataset"].iloc[0] == "synthetic_cityscapes"
    assert _cell(tables["table4_pavpu"], "u2pl", "np", "186")["mean"] == pytest.approx(50.0)
    assert T.build_tables(uri, "no-such-experiment")["table1_miou_pascal_classic"].status.eq("missing").all()


def test_fixmatch_and_unimatch_rows_follow_the_papers_frameworks(uri, tmp_path):
    """The companion spec's frameworks (jobs/specs/paper_unimatch.yaml) print after the paper's five in each head
    block, labelled, under every protocol; an experiment without their runs keeps the paper's rows only."""
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("companion")
    _cell_run(client, experiment_id, framework="u2pl", head="np", partition="92", miou=0.6, pavpu=0.8,
              protocol="corrected")
    for head, miou in (("baseline", 0.62), ("np", 0.64)):
        _cell_run(client, experiment_id, framework="unimatch", head=head, partition="92", miou=miou, pavpu=0.8,
                  protocol="released")
    _cell_run(client, experiment_id, framework="fixmatch", head="mc_dropout", partition="183", miou=0.58,
              protocol="corrected")
    tables = T.build_tables(uri, "companion")
    order = [*T.PAPER_FRAMEWORKS, "fixmatch", "unimatch"]
    for protocol in ("released", "corrected"):
        table = tables[f"table1_miou_pascal_classic_{protocol}"]
        assert len(table) == len(order) * len(T.PAPER_HEADS) * 4
        rows = list(dict.fromkeys(zip(table["block"], table["row"], table["framework"])))
        for block_rows in (rows[i:i + len(order)] for i in range(0, len(rows), len(order))):
            assert [framework for _, _, framework in block_rows] == order
    released = tables["table1_miou_pascal_classic_released"]
    assert _cell(released, "unimatch", "np", "92")["mean"] == pytest.approx(64.0)
    assert _cell(released, "unimatch", "np", "92")["row"] == "UniMatch w/ NP-SemiSeg"
    assert _cell(released, "fixmatch", "baseline", "92")["row"] == "FixMatch"
    assert math.isnan(_cell(released, "unimatch", "baseline", "92")["paper"])  # the paper has no such row
    corrected = tables["table1_miou_pascal_classic_corrected"]
    assert _cell(corrected, "fixmatch", "mc_dropout", "183")["mean"] == pytest.approx(58.0)
    markdown = T.markdown_report(tables)
    assert "| UniMatch | 62.00 |" in markdown and "| FixMatch w/ MC dropout | — | 58.00 |" in markdown
    # Tables 4-6 stay U2PL's
    assert set(tables["table4_pavpu_released"]["framework"]) == {"u2pl"}
    # without their runs: the paper's frameworks only; explicit rows win
    assert T.table_frameworks(T.load_cell_runs(uri, "no-such-experiment")) == list(T.PAPER_FRAMEWORKS)
    only = T.build_tables(uri, "companion", frameworks=["unimatch"])["table1_miou_pascal_classic_released"]
    assert set(only["framework"]) == {"unimatch"}


def test_uncertainty_time_figure_from_benchmark_runs(uri, tmp_path):
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("bench")
    assert T.uncertainty_time_figure(uri, "bench") is None
    for head, slope in (("mc_dropout", 0.5), ("np", 0.05)):
        for mode in ("center_crop", "sliding"):
            T.log_uncertainty_time_run(uri, "bench", head=head, eval_mode=mode,
                                       seconds_by_t={t: slope * t for t in (10, 1, 5)})
    # an unfinished run is not plotted
    client.create_run(experiment_id, tags={"npsemiseg.kind": "benchmark", "benchmark": T.UNCERTAINTY_TIME_BENCHMARK,
                                           "head": "np", "eval_mode": "whole"})
    panels = T.load_uncertainty_times(uri, "bench")
    assert set(panels) == {"center_crop", "sliding"}
    assert panels["sliding"]["MC dropout"] == ([1, 5, 10], [0.5, 2.5, 5.0])
    figure = T.uncertainty_time_figure(uri, "bench")
    assert [ax.get_title() for ax in figure.axes] == ["center_crop", "sliding"]
    assert len(figure.axes[0].lines) == 2
    assert list(figure.axes[1].lines[0].get_ydata()) == [0.5, 2.5, 5.0]
    with pytest.raises(ValueError, match="seconds_by_t"):
        T.log_uncertainty_time_run(uri, "bench", head="np", eval_mode="sliding", seconds_by_t={})
    _, written = T.write_report(uri, "bench", tmp_path / "out")
    assert (tmp_path / "out" / "uncertainty_time.png").stat().st_size > 1000


def test_line_panels_rejects_nothing_to_plot():
    with pytest.raises(ValueError, match="panels"):
        T.line_panels({}, xlabel="x", ylabel="y")


def test_tables_command_writes_and_prints_the_tables(store, tmp_path):
    from typer.testing import CliRunner

    from semiseg_platform.cli.main import app

    uri, expected = store
    result = CliRunner().invoke(app, ["tables", "--experiment", "study", "--out", str(tmp_path / "t"),
                                      "--tracking", uri, "--grid-id", GRID])
    assert result.exit_code == 0, result.output
    assert "### Table 1: mIoU on VOC (classic)" in result.output
    assert f"| U2PL | {100 * expected[('u2pl', 'baseline', '92')][0][0]:.2f} |" in result.output
    assert (tmp_path / "t" / "table6_attention_pavpu.parquet").is_file()


def test_tables_group_by_protocol_and_never_mix_two(uri, tmp_path):
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("protocols")
    for protocol, miou in (("released", 0.61), ("corrected", 0.55)):
        _cell_run(client, experiment_id, framework="u2pl", head="np", partition="92", miou=miou, pavpu=0.8,
                  protocol=protocol)
    tables = T.build_tables(uri, "protocols")
    names = [n for n in tables if n.startswith("table1")]
    assert names == ["table1_miou_pascal_classic_released", "table1_miou_pascal_classic_corrected"]
    for protocol, expected in (("released", 61.0), ("corrected", 55.0)):
        table = tables[f"table1_miou_pascal_classic_{protocol}"]
        row = _cell(table, "u2pl", "np", "92")
        assert row["mean"] == pytest.approx(expected) and row.n == 1  # one run: never averaged with the other
        assert table.attrs["protocol"] == protocol and f"[protocol {protocol}]" in table.attrs["title"]
    # both protocols side by side: released / corrected (corrected - released), a side without a run marked
    _cell_run(client, experiment_id, framework="u2pl", head="baseline", partition="92", miou=0.5, protocol="released")
    compared = T.protocols_side_by_side(tables := T.build_tables(uri, "protocols"))
    assert set(compared) >= {"table1_miou_pascal_classic", "table4_pavpu"}
    table1 = compared["table1_miou_pascal_classic"]
    assert "released / corrected (corrected − released)" in table1 and "[protocol" not in table1
    assert "| 61.00 / 55.00 (-6.00) |" in table1 and "| 50.00 / — |" in table1
    assert "61.00 / 55.00 (-6.00)" in T.markdown_report(tables)
    written = {p.name for p in T.write_tables(tables, tmp_path)}
    assert "table1_miou_pascal_classic_protocols.md" in written
    assert table1 in (tmp_path / "tables.md").read_text()
    # one protocol only: the tables keep their plain names, nothing to put side by side
    only = client.create_experiment("released-only")
    _cell_run(client, only, framework="u2pl", head="np", partition="92", miou=0.6, protocol="released")
    assert "table1_miou_pascal_classic" in T.build_tables(uri, "released-only")
    assert T.protocols_side_by_side(T.build_tables(uri, "released-only")) == {}


def test_paper_numbers_ship_with_the_package_and_print_beside_ours(store, tmp_path):
    uri, expected = store
    results = T.paper_results()
    # Tables 1-3 (3 x 48 mIoU), Table 4 (24 PAvPU), the mean aggregator of Tables 5-6 (12 + 12; their
    # attention column repeats Tables 1-3 and 4)
    assert len(results) == 3 * 48 + 24 + 12 + 12
    assert T.paper_value("pascal_classic", "mt", "baseline", "92", "miou") == 48.37
    assert T.paper_value("cityscapes", "u2pl", "np", "186", "pavpu") == 84.05
    assert T.paper_value("synthetic_voc", "mt", "baseline", "92", "miou") is None
    table = T.build_tables(uri, "study", grid_id=GRID)["table1_miou_pascal_classic"]
    row = _cell(table, "mt", "baseline", "92")
    ours = 100 * expected[("mt", "baseline", "92")][0][0]
    assert row["paper"] == 48.37 and row["diff"] == pytest.approx(ours - 48.37)
    assert T.format_versus_paper(48.37, ours, "ok") == f"48.37 / {ours:.2f} ({ours - 48.37:+.2f})"
    report = T.markdown_report({"table1_miou_pascal_classic": table})
    assert "paper / ours" in report and f"| MT | 48.37 / {ours:.2f} ({ours - 48.37:+.2f}) |" in report
    mt_np = next(line for line in report.splitlines() if "| MT w/ NP-SemiSeg | 49.02 / " in line)
    assert mt_np.split(" | ")[2] == "58.91 / —"  # (mt, np, 183): the paper's value, no run of ours


def test_unimatch_v2_rows_print_beside_its_published_numbers(uri):
    """UniMatch V2's own experiment (jobs/specs/paper_unimatch_v2.yaml): its rows alone, classic VOC's full 1464 as
    a column of its own, ADE20K's table, and its published mIoU (README / training logs, with their source) in the
    ``paper`` column of its baseline rows; the DINOv2-S variant beside its own."""
    from semiseg_platform.reports.paper_results import unimatch_v2_results

    client = MlflowClient(uri)
    experiment_id = client.create_experiment("unimatch-v2")
    for framework, head, partition, miou in (("unimatch_v2", "baseline", "92", 0.85), ("unimatch_v2", "np", "1464", 0.9),
                                             ("unimatch_v2_s", "baseline", "92", 0.78)):
        _cell_run(client, experiment_id, framework=framework, head=head, partition=partition, miou=miou)
    _cell_run(client, experiment_id, framework="unimatch_v2", head="np", partition="316", miou=0.4, dataset="ade20k")
    _cell_run(client, experiment_id, framework="fixmatch_v2", head="baseline", partition="316", miou=0.37,
              dataset="ade20k")
    tables = T.build_tables(uri, "unimatch-v2")
    voc = tables["table1_miou_pascal_classic"]
    # every framework of the experiment has its rows in each table (FixMatch V2's VOC rows empty here)
    assert list(dict.fromkeys(voc["framework"])) == ["fixmatch_v2", "unimatch_v2", "unimatch_v2_s"]
    assert voc.attrs["columns"][-1] == "full (1464)" and len(voc.attrs["columns"]) == 5
    assert _cell(voc, "unimatch_v2", "baseline", "92")["paper"] == pytest.approx(86.3)
    assert _cell(voc, "unimatch_v2", "baseline", "92")["diff"] == pytest.approx(85.0 - 86.3)
    assert _cell(voc, "unimatch_v2_s", "baseline", "92")["paper"] == pytest.approx(79.0)
    assert _cell(voc, "unimatch_v2", "np", "1464")["mean"] == pytest.approx(90.0)
    assert math.isnan(_cell(voc, "unimatch_v2", "np", "92")["paper"])  # V2 has no NP rows
    ade = tables["table_miou_ade20k"]
    assert _cell(ade, "unimatch_v2", "baseline", "316")["paper"] == pytest.approx(38.7)
    assert _cell(ade, "fixmatch_v2", "baseline", "316")["paper"] == pytest.approx(37.8)  # Table 5's log (paper_ade_coco)
    value, source = unimatch_v2_results()[("cityscapes", "unimatch_v2", "baseline", "186", "miou")]
    assert value == 83.6 and "table02-cityscapes_unimatch_v2_1_16labels_dinov2_base.log (best EMA mIoU 83.60)" in source
    for (_, framework, *_), (value, source) in unimatch_v2_results().items():  # each value as its log's best, rounded
        best = float(source.split("best EMA mIoU ")[1].split(")")[0])
        assert value == round(best + 1e-9, 1) and ("dinov2_base" in source) == (framework != "unimatch_v2_s")


def test_reliability_table_per_partition_with_every_metric_and_its_values(uri, tmp_path):
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("reliability")
    metric_names = [m for m, _, _ in T.RELIABILITY_COLUMNS]
    logged = {}
    for index, (head, seed) in enumerate((("baseline", 0), ("np", 0), ("np", 1))):
        values = {m: 0.1 + 0.01 * k + 0.1 * index for k, m in enumerate(metric_names)}
        values.update({f"best/{m}": v + 0.05 for m, v in values.items()}, **{f"last/{m}": v for m, v in values.items()},
                      **{f"best_student/{m}": v - 0.03 for m, v in values.items()})
        _cell_run(client, experiment_id, framework="u2pl", head=head, partition="92", seed=seed,
                  metrics=values, grid_id="rel")
        logged[(head, seed)] = values
    _cell_run(client, experiment_id, framework="u2pl", head="mc_dropout", partition="92", status="FAILED",
              grid_id="rel")
    tables = T.with_reliability_tables(T.build_tables(uri, "reliability", grid_id="rel"))
    table = tables["reliability_pascal_classic_92"]
    assert table.attrs["columns"][:3] == ["mIoU ↑", "ECE ↓", "ECE (equal-mass) ↓"]
    assert list(dict.fromkeys(table["head"])) == ["baseline", "mc_dropout", "np"]  # the paper's head order
    nll = table[(table["head"] == "baseline") & (table["metric"] == "nll")].iloc[0]
    assert nll["mean"] == pytest.approx(logged[("baseline", 0)]["nll"])  # nats, not x 100
    ece = table[(table["head"] == "np") & (table["metric"] == "ece")].iloc[0]
    both = [100 * logged[("np", s)]["ece"] for s in (0, 1)]
    assert (ece["mean"], ece["std"], ece["n"]) == (pytest.approx(statistics.fmean(both)),
                                                    pytest.approx(statistics.stdev(both)), 2)
    assert (table[table["head"] == "mc_dropout"]["status"] == "failed").all()
    best = T.reliability_tables(tables["cells"], values="best")["reliability_pascal_classic_92_best"]
    aurc = best[(best["head"] == "baseline") & (best["metric"] == "aurc")].iloc[0]
    assert aurc["mean"] == pytest.approx(100 * logged[("baseline", 0)]["best/aurc"])
    assert "best values" in best.attrs["title"] and "final values" in table.attrs["title"]
    student = T.reliability_tables(tables["cells"], values="best_student")["reliability_pascal_classic_92_best_student"]
    ece = student[(student["head"] == "baseline") & (student["metric"] == "ece")].iloc[0]
    assert ece["mean"] == pytest.approx(100 * logged[("baseline", 0)]["best_student/ece"])
    assert "best_student values" in student.attrs["title"] and "student" in student.attrs["caption"]
    markdown = T.to_markdown(table)
    assert "| U2PL | baseline |" in markdown and "|  | NP-SemiSeg |" in markdown
    assert "x 100 except NLL (nats)" in markdown
    T.write_tables({"reliability_pascal_classic_92": table}, tmp_path)
    assert "\\downarrow" in (tmp_path / "reliability_pascal_classic_92.tex").read_text()


def test_reliability_figure_draws_the_heads_of_each_framework_from_the_cells_curves(uri, tmp_path):
    import json

    from semiseg_platform.reports.reliability_figure import load_curves, reliability_figure
    from semiseg_platform.tracking.mlflow_names import CELL_CURVES

    client = MlflowClient(uri)
    experiment_id = client.create_experiment("reliability-figure", artifact_location=str(tmp_path / "artifacts"))
    curves = {"reliability": {"lower": [0.0, 0.5], "upper": [0.5, 1.0], "count": [0.0, 4.0], "confidence": [None, 0.8],
                              "accuracy": [None, 0.75]},
              "risk_coverage": {"coverage": [0.5, 1.0], "risk": [0.0, 0.25]}}
    for head in ("baseline", "np", "mc_dropout"):
        run_id = _cell_run(client, experiment_id, framework="u2pl", head=head, partition="92", miou=0.5,
                           grid_id="fig")
        if head != "mc_dropout":  # a cell logged before the curves existed is left out
            (tmp_path / "reliability_curves.json").write_text(json.dumps(curves))
            client.log_artifact(run_id, str(tmp_path / "reliability_curves.json"), CELL_CURVES.rpartition("/")[0])
    tables, written = T.write_report(uri, "reliability-figure", tmp_path / "report", grid_id="fig")
    assert (tmp_path / "report" / "reliability_pascal_classic_92.png") in written
    loaded = load_curves(client, tables["cells"])
    assert set(loaded) == {("", "pascal_classic", "u2pl", head, "92") for head in ("baseline", "np")}
    figure = reliability_figure(loaded, tables["cells"], "pascal_classic", "92", title="t")
    diagram, risk = figure.axes
    assert [line.get_label() for line in risk.lines] == ["baseline", "NP-SemiSeg"]  # the heads side by side
    assert list(risk.lines[1].get_ydata()) == [0.0, 0.25]
    assert list(diagram.lines[0].get_ydata()) == [0.75]  # the empty bin is not drawn

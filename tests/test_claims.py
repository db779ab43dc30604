"""The claims report (``docs/claims.md``) on runs written to a real MLflow store with known values."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from platform_fixtures import fresh_store
from typer.testing import CliRunner

from semiseg_platform.cli.main import app
from semiseg_platform.reports import log_uncertainty_time_run
from semiseg_platform.reports.claim_evidence import (
    CONTRADICTED,
    INCONCLUSIVE,
    NO_DATA,
    SUPPORTED,
    bootstrap_interval,
    evidence,
    paired_diffs,
)
from semiseg_platform.reports.claims import (
    PAPER_Q,
    cell_claims,
    check_claims,
    claims_command,
    hyperparameter_claim,
    log_claims,
    write_claims,
)
from semiseg_platform.reports.claims_figure import (
    FOREST_PLOT,
    POOLED,
    forest_figure,
    forest_rows,
    write_forest_plot,
)
from semiseg_platform.reports.claims_figure import main as claims_figure_main

SEEDS = (0, 1, 2)
#: mIoU of the baseline head per framework; S0 differences vs supervised: +10, +2, +5, +2 points
BASELINE = {"supervised": 0.30, "mt": 0.40, "psmt": 0.32, "u2pl": 0.35, "augseg": 0.32}


def _cell(client: MlflowClient, experiment_id: str, framework: str, head: str, seed: int, miou: float, pavpu: float,
          *, partition: str = "1/16", params: dict | None = None, tags: dict | None = None) -> None:
    run = client.create_run(experiment_id, tags={
        "npsemiseg.kind": "cell", "framework": framework, "dataset": "study", "partition": partition, "head": head,
        "seed": str(seed), "cell_id": f"{framework}-{head}-{partition}-{seed}-{len(params or {})}", **(tags or {})})
    client.log_batch(run.info.run_id, metrics=[Metric("miou", miou, 0, 0), Metric("pavpu", pavpu, 0, 0)],
                     params=[Param(k, str(v)) for k, v in (params or {}).items()])
    client.set_terminated(run.info.run_id, "FINISHED")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Experiment ``known``: S0 supported, C1 contradicted, C2 supported, C3 inconclusive, C4 no data,
    C5 supported, C6 inconclusive (only its Q part has runs). Experiment ``worse``: PS-MT below supervised."""
    uri = fresh_store(tmp_path_factory, "claims")
    client = MlflowClient(uri)
    known, worse = client.create_experiment("known"), client.create_experiment("worse")
    for seed in SEEDS:
        for framework, base in BASELINE.items():
            _cell(client, known, framework, "baseline", seed, base + seed / 100, 0.5)
            _cell(client, worse, framework, "baseline", seed, (0.27 if framework == "psmt" else base) + seed / 100, 0.5)
            # MC dropout 2 points below the baseline, NP 1 above MC dropout (1 below the baseline);
            # PAvPU: NP - MC dropout alternates +1 / -1 point
            _cell(client, known, framework, "mc_dropout", seed, base - 0.02 + seed / 100, 0.50)
            _cell(client, known, framework, "np", seed, base - 0.01 + seed / 100, 0.51 if seed % 2 else 0.49)
    for mode, extra in (("center_crop", 0.0), ("sliding", 0.05)):
        for head, seconds in (("mc_dropout", lambda t, extra=extra: 0.1 * t + extra * t), ("np", lambda t: 0.02 + 0.01 * t)):
            log_uncertainty_time_run(uri, "known", head=head, eval_mode=mode, dataset="study",
                                     seconds_by_t={t: seconds(t) for t in (1, 5, 10, 20)})
    for q, miou in ((256, 0.30), (256, 0.31), (2560, 0.40), (2560, 0.42)):  # T under its name before the rename
        _cell(client, known, "u2pl", "np", 9, miou, 0.5, partition="1/8", tags={"search_id": "s1"},
              params={"head.options.memory_size": q, "head.options.lambda_kl": 0.005, "head.options.num_samples": 5})
    return uri


def test_each_verdict_is_reached_and_missing_cells_give_no_data(store):
    claims = {c.id: c for c in check_claims(store, "known", search_experiment="known")}
    verdicts = {key: claim.verdict for key, claim in claims.items()}
    assert verdicts == {"S0": SUPPORTED, "S1": NO_DATA, "C1": CONTRADICTED, "C2": SUPPORTED, "C3": INCONCLUSIVE,
                        "C4": NO_DATA, "R1": NO_DATA, "R2": NO_DATA, "C5": SUPPORTED, "C6": INCONCLUSIVE}
    s0 = {p.name: p for p in claims["S0"].parts}
    assert s0["mt"].pairs == 3 and s0["mt"].mean_diff == pytest.approx(10) and s0["mt"].ci_low == pytest.approx(10)
    assert claims["S0"].pooled.pairs == 12
    assert claims["C1"].pooled.mean_diff == pytest.approx(-1) and claims["C1"].pooled.pairs == 12
    assert [p.pairs for p in claims["C4"].parts] == [0, 0]
    assert [p.verdict for p in claims["C6"].parts] == [SUPPORTED, NO_DATA, NO_DATA]
    assert claims["C6"].parts[0].mean_diff == pytest.approx(10.5) and claims["C6"].parts[0].pairs == 4


def test_one_framework_below_supervised_contradicts_s0(store):
    s0 = check_claims(store, "worse")[0]
    assert s0.verdict == CONTRADICTED
    assert {p.name: p.verdict for p in s0.parts}["psmt"] == CONTRADICTED


def test_replicate_experiments_pair_within_each_and_pool(store, tmp_path):
    """``known`` and ``worse`` as replicates: PS-MT +2 points in one, -3 in the other; pairs never cross experiments
    (crossing would make 3 x 3 pairs per experiment pair instead of 3 + 3)."""
    claims = {c.id: c for c in check_claims(store, ["known", "worse"])}
    s0 = {p.name: p for p in claims["S0"].parts}
    assert s0["psmt"].pairs == 6 and s0["psmt"].mean_diff == pytest.approx(-0.5)
    assert sorted(s0["psmt"].diffs) == pytest.approx([-3.0] * 3 + [2.0] * 3)
    assert s0["mt"].pairs == 6 and s0["mt"].mean_diff == pytest.approx(10) and claims["S0"].pooled.pairs == 24
    assert claims["S0"].verdict == INCONCLUSIVE  # PS-MT's interval [-3, +2] contains 0
    assert claims["C1"].pooled.pairs == 12  # ``worse`` has no NP cells
    result = CliRunner().invoke(app, ["claims", "--experiment", "known", "--experiment", "worse", "--tracking", store,
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "Runs: experiments `known`, `worse`, replicates of one study" in result.output
    assert json.loads((tmp_path / "claims.json").read_text())[0]["per_framework"]["psmt"]["pairs"] == 6
    missing = CliRunner().invoke(app, ["claims", "--experiment", "known", "--experiment", "nope", "--tracking", store,
                                       "--out", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "no experiment 'nope'" in missing.stderr and not (tmp_path / "x").exists()


def test_bootstrap_interval_on_hand_computed_cases():
    # two pairs: resampled means are 1, 2, 3 with probabilities 1/4, 1/2, 1/4
    assert bootstrap_interval([1.0, 3.0]) == (1.0, 3.0)
    # [0, 0, 0, 10]: mean = 2.5 K with K ~ Binomial(4, 1/4); P(K=0) = 0.316 > 2.5 %, P(K<=2) = 0.949 < 97.5 %
    assert bootstrap_interval([0.0, 0.0, 0.0, 10.0]) == (0.0, 7.5)
    assert bootstrap_interval([0.3, -0.1, 0.5]) == bootstrap_interval([0.3, -0.1, 0.5])  # seeded
    assert evidence("x", [0.0, 0.0, 0.0, 10.0]).verdict == INCONCLUSIVE
    assert evidence("x", [2.0]).verdict == INCONCLUSIVE and evidence("x", []).verdict == NO_DATA


def test_report_files_printed_and_logged_on_the_parent_run(store, tmp_path):
    client = MlflowClient(store)
    parent = client.create_run(client.get_experiment_by_name("known").experiment_id).info.run_id
    printed: list[str] = []
    claims_command("known", tracking=store, out=tmp_path, parent_run_id=parent, emit=printed.append)
    data = json.loads((tmp_path / "claims.json").read_text())
    assert [c["id"] for c in data] == ["S0", "S1", "C1", "C2", "C3", "C4", "R1", "R2", "C5", "C6"]
    for key in ("id", "verdict", "mean_diff", "ci_low", "ci_high", "pairs"):
        assert all(key in c for c in data)
    assert set(data[0]["per_framework"]) == {"mt", "psmt", "u2pl", "augseg"}
    markdown = (tmp_path / "claims.md").read_text()
    assert printed == [markdown] and "| S0 | **supported** | +4.75 |" in markdown
    assert "Runs: experiment `known`." in markdown
    assert sorted(a.path for a in client.list_artifacts(parent, "claims")) == [
        "claims/claims.json", "claims/claims.md", f"claims/{FOREST_PLOT}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.json", "claims.md", FOREST_PLOT]
    log_claims(store, parent, [])  # an empty report is still a valid pair of files (no picture)


def test_partitions_without_the_compared_heads_do_not_enter_c3(tmp_path_factory):
    uri = fresh_store(tmp_path_factory, "claims_full")
    client = MlflowClient(uri)
    experiment = client.create_experiment("gap")
    for seed in SEEDS:
        _cell(client, experiment, "supervised", "baseline", seed, 0.6 + seed / 100, 0.5, partition="full")
        _cell(client, experiment, "supervised", "baseline", seed, 0.4, 0.5)
        _cell(client, experiment, "u2pl", "mc_dropout", seed, 0.4, 0.50)
        _cell(client, experiment, "u2pl", "np", seed, 0.4, 0.52 + seed / 100)
    claims = {c.id: c for c in check_claims(uri, "gap")}
    assert [p.name for p in claims["C3"].parts] == ["1/16"] and claims["C3"].verdict == SUPPORTED
    assert claims["S1"].verdict == SUPPORTED and claims["S1"].pooled.mean_diff == pytest.approx(21)


def test_s0_compares_a_framework_with_supervised_on_its_own_network_when_the_grid_ran_it(tmp_path_factory, tmp_path):
    """The reference's network is read from ``model.variant``, the parameter's name before ``model.decoder``: runs
    logged before the rename still find their reference."""
    uri = fresh_store(tmp_path_factory, "claims_networks")
    client = MlflowClient(uri)
    experiment = client.create_experiment("networks")
    networks = {"supervised": "u2pl", "mt": "u2pl", "u2pl": "u2pl", "psmt": "psmt", "augseg": "augseg"}
    for seed in SEEDS:
        for framework, base in BASELINE.items():
            _cell(client, experiment, framework, "baseline", seed, base + seed / 100, 0.5,
                  params={"model.decoder": networks[framework]}, tags={"framework_name": framework})
        # the supervised reference on PS-MT's network: 4 points below PS-MT (the plain one: 2 below)
        _cell(client, experiment, "supervised_psmt", "baseline", seed, 0.28 + seed / 100, 0.5,
              params={"model.variant": "psmt"}, tags={"framework_name": "supervised"})
    s0 = {p.name: p for p in check_claims(uri, "networks")[0].parts}
    assert s0["psmt"].mean_diff == pytest.approx(4) and s0["psmt"].against == "supervised_psmt"
    assert s0["mt"].mean_diff == pytest.approx(10) and s0["mt"].against == "supervised"
    # no supervised cells on AugSeg's network: the plain reference, and the report says the networks differ
    assert s0["augseg"].mean_diff == pytest.approx(2)
    assert s0["augseg"].against.startswith("supervised (network u2pl; augseg's is augseg")
    claims_command("networks", tracking=uri, out=tmp_path, emit=lambda text: None)
    markdown = (tmp_path / "claims.md").read_text()
    assert "| psmt vs supervised_psmt | supported | +4.00 |" in markdown
    per_framework = json.loads((tmp_path / "claims.json").read_text())[0]["per_framework"]
    assert per_framework["psmt"]["against"] == "supervised_psmt" and per_framework["mt"]["against"] == "supervised"


def test_a_framework_not_run_leaves_s0_without_a_verdict(tmp_path_factory):
    uri = fresh_store(tmp_path_factory, "claims_partial")
    client = MlflowClient(uri)
    experiment = client.create_experiment("partial")
    for seed in SEEDS:
        for framework in ("supervised", "mt", "u2pl", "augseg"):  # no PS-MT
            _cell(client, experiment, framework, "baseline", seed, BASELINE[framework] + seed / 100, 0.5)
    s0 = check_claims(uri, "partial")[0]
    assert {p.name: p.verdict for p in s0.parts}["psmt"] == NO_DATA and s0.verdict == INCONCLUSIVE


def test_cli_writes_and_prints_the_report(store, tmp_path):
    result = CliRunner().invoke(app, ["claims", "--experiment", "known", "--tracking", store, "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "| S0 | **supported** |" in result.output
    verdicts = {claim["id"]: claim["verdict"] for claim in json.loads((tmp_path / "c" / "claims.json").read_text())}
    assert verdicts["S0"] == SUPPORTED and verdicts["C1"] == CONTRADICTED


@pytest.mark.parametrize("case", ["no_store", "no_experiment", "out_is_a_file"])
def test_cli_bad_input_is_one_line_and_writes_nothing(store, tmp_path, case):
    out, tracking, experiment = tmp_path / "out", store, "known"
    if case == "no_store":
        tracking = f"sqlite:///{tmp_path / 'missing' / 'mlruns.db'}"
    elif case == "no_experiment":
        experiment = "nope"
    else:
        out.write_text("a file")
    result = CliRunner().invoke(app, ["claims", "--experiment", experiment, "--tracking", tracking, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    expected = {"no_store": "no MLflow store", "no_experiment": "no experiment 'nope'", "out_is_a_file": "is a file"}
    assert expected[case] in lines[0]
    assert not (tmp_path / "missing").exists()
    assert out.is_file() if case == "out_is_a_file" else not out.exists()


def _random_cells(seed: int = 0) -> pd.DataFrame:
    """Finished cells of two replicates, every framework and head at two partitions and five seeds, with
    random metrics: differences that are all distinct, so that resampling them in another order moves
    the interval."""
    rng = np.random.default_rng(seed)
    rows = [{"replicate": replicate, "framework": framework, "framework_name": framework, "decoder": "",
             "dataset": "study", "partition": partition, "head": head, "seed": str(s),
             "miou": rng.uniform(0.2, 0.6), "pavpu": rng.uniform(0.4, 0.9)}
            for replicate in ("a", "b") for framework in ("supervised", "mt", "psmt", "u2pl", "augseg")
            for partition in ("1/16", "full") for head in ("baseline", "mc_dropout", "np", "np_mean")
            for s in range(5)]
    return pd.DataFrame(rows)


def test_the_same_runs_in_another_order_give_the_same_claims():
    """MLflow returns runs in an order that is not the runs' identity: the pairs, their differences and
    every interval must not depend on it (two runs of one grid once gave [+2.27, +6.69] and [+2.34, +6.66])."""
    cells = _random_cells()
    reference = cell_claims(cells)
    for shuffle in range(4):
        shuffled = cells.sample(frac=1, random_state=shuffle).reset_index(drop=True)
        claims = cell_claims(shuffled)
        assert [c.to_dict() for c in claims] == [c.to_dict() for c in reference]
        for claim, expected in zip(claims, reference):  # the differences themselves, in the pairs' key order
            for got, want in zip([claim.pooled, *claim.parts, *claim.detail],
                                 [expected.pooled, *expected.parts, *expected.detail]):
                assert got.diffs == want.diffs
    c1_mt = {e.name: e for e in reference[2].detail}["mt"]
    assert c1_mt.pairs == 20 and len(set(c1_mt.diffs)) == 20  # distinct differences: order would matter


def test_paired_differences_come_in_the_order_of_the_pairs_key():
    cells = _random_cells()
    shuffled = cells.sample(frac=1, random_state=1)
    diffs = paired_diffs(shuffled, "miou", {"head": "np"}, {"head": "baseline"}, where={"framework": "mt"})
    side = cells[cells["framework"] == "mt"].set_index(["replicate", "dataset", "partition", "seed", "head"])["miou"]
    keys = sorted({key[:4] for key in side.index})
    assert diffs == pytest.approx([100 * (side[(*key, "np")] - side[(*key, "baseline")]) for key in keys])


def test_intervals_do_not_depend_on_the_order_of_the_differences():
    diffs = list(np.random.default_rng(3).normal(4.5, 3.0, size=12))
    reference = bootstrap_interval(diffs)
    for seed in range(4):
        assert bootstrap_interval(list(np.random.default_rng(seed).permutation(diffs))) == reference
    trials = pd.DataFrame({"q": [256.0] * 4 + [2560.0] * 4, "lambda_kl": 0.005, "t": 5.0,
                           "miou": np.random.default_rng(4).uniform(0.3, 0.5, size=8)})
    c6 = hyperparameter_claim(trials).to_dict()
    for seed in range(4):
        assert hyperparameter_claim(trials.sample(frac=1, random_state=seed)).to_dict() == c6


def test_the_forest_plot_has_one_row_per_claim_and_part_with_data(store, tmp_path):
    """S0 and C1 per framework, C2 and C5 per comparison, C3 per partition, C6 per hyper-parameter; no data left out."""
    claims = check_claims(store, "known", search_experiment="known")
    rows = write_forest_plot([c.to_dict() for c in claims], tmp_path / "forest.png")
    assert (tmp_path / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    frameworks = ["mt", "psmt", "u2pl", "augseg"]
    assert [(r.claim, r.label) for r in rows] == [
        ("S0", POOLED), *[("S0", f"{f} vs supervised") for f in frameworks],  # S1, C4: no data
        ("C1", POOLED), *[("C1", f) for f in frameworks],
        ("C2", POOLED), ("C2", "baseline - mc_dropout"), ("C2", "np - mc_dropout"),
        ("C3", "1/16"),  # its pooled row is its one partition's
        ("C5", "faster"), ("C5", "gap grows with T"), ("C5", "gap larger with sliding evaluation"),
        ("C6", f"Q < {PAPER_Q} hurts")]
    by_text = {r.text: r for r in rows}
    assert by_text["S0 mt vs supervised"].mean == pytest.approx(10) and by_text["S0 mt vs supervised"].pairs == 3
    assert by_text["C1 all pairs"].verdict == CONTRADICTED and by_text["C2 all pairs"].verdict == SUPPORTED
    assert by_text["C3 1/16"].verdict == INCONCLUSIVE and by_text["C5 faster"].unit == "seconds per image"
    # the figure holds those rows: a panel for points, one for seconds, the rows' labels top to bottom
    figure = forest_figure(rows)
    points, seconds = figure.axes
    assert [t.get_text() for t in points.get_yticklabels()] == [r.text for r in rows if r.claim != "C5"]
    assert [t.get_text() for t in seconds.get_yticklabels()] == [r.text for r in rows if r.claim == "C5"]
    drawn = np.array([(bars.lines[0].get_xdata()[0], *bars.lines[2][0].get_segments()[0][:, 0])
                      for bars in points.containers])  # each row's dot and bar: mean, low, high
    assert drawn == pytest.approx(np.array([(r.mean, r.low, r.high) for r in rows if r.claim != "C5"]))
    assert drawn[1] == pytest.approx([10, 10, 10]) and points.lines[-1].get_xdata()[0] == 0  # S0 mt; the zero line


def test_the_forest_plot_refuses_a_report_without_differences(store, tmp_path):
    no_data = [c.to_dict() for c in check_claims(store, "nothing here")]
    assert {c["verdict"] for c in no_data} == {NO_DATA} and forest_rows(no_data) == []
    with pytest.raises(ValueError, match="no claim has a difference to plot"):
        write_forest_plot(no_data, tmp_path / "forest.png")
    with pytest.raises(ValueError, match="no claim has a difference to plot"):
        write_forest_plot([], tmp_path / "forest.png")
    assert not (tmp_path / "forest.png").exists()
    # the report itself is still written, without a picture (and without an older report's)
    (tmp_path / FOREST_PLOT).write_bytes(b"old")
    written = write_claims([], tmp_path)
    assert [p.name for p in written] == ["claims.md", "claims.json"] and not (tmp_path / FOREST_PLOT).exists()
    assert "![" not in (tmp_path / "claims.md").read_text()


def test_a_recorded_claims_json_is_drawn_again_from_the_command_line(store, tmp_path, capsys):
    claims_command("known", tracking=store, out=tmp_path, emit=lambda text: None)
    assert f"]({FOREST_PLOT})" in (tmp_path / "claims.md").read_text()
    assert claims_figure_main([str(tmp_path / "claims.json"), str(tmp_path / "again.png"), "--title", "t"]) == 0
    assert (tmp_path / "again.png").stat().st_size > 0 and "again.png: 18 rows" in capsys.readouterr().out
    (tmp_path / "empty.json").write_text("[]")
    assert claims_figure_main([str(tmp_path / "empty.json"), str(tmp_path / "none.png")]) == 2
    assert "error: forest plot: no claim has a difference" in capsys.readouterr().err


def test_fixmatch_and_unimatch_get_their_own_claims_against_supervised_unimatch(tmp_path_factory, tmp_path):
    """FixMatch and UniMatch train AugSeg's network, as ``supervised_augseg`` and ``supervised_unimatch`` do: the
    network alone does not name their reference; both pair with ``supervised_unimatch`` (AugSeg with its own)."""
    uri = fresh_store(tmp_path_factory, "claims_companions")
    client = MlflowClient(uri)
    experiment = client.create_experiment("companions")
    networks = {"supervised": "u2pl", "mt": "u2pl", "u2pl": "u2pl", "psmt": "psmt", "augseg": "augseg",
                "supervised_augseg": "augseg", "supervised_unimatch": "augseg", "fixmatch": "augseg",
                "unimatch": "augseg"}
    # supervised_augseg 0.30 (AugSeg +2), supervised_unimatch 0.25 (FixMatch +8, UniMatch +11: against
    # supervised_augseg they would be +3 and +6)
    baseline = {**BASELINE, "supervised_augseg": 0.30, "supervised_unimatch": 0.25, "fixmatch": 0.33, "unimatch": 0.36}
    for seed in SEEDS:
        for framework, base in baseline.items():
            name = "supervised" if framework.startswith("supervised") else framework
            _cell(client, experiment, framework, "baseline", seed, base + seed / 100, 0.5,
                  params={"model.decoder": networks[framework]}, tags={"framework_name": name})
        for framework in ("fixmatch", "unimatch"):  # MC dropout 2 below the baseline, NP 1 above; PAvPU +5
            base = baseline[framework] + seed / 100
            _cell(client, experiment, framework, "mc_dropout", seed, base - 0.02, 0.50, params={"model.decoder": "augseg"})
            _cell(client, experiment, framework, "np", seed, base + 0.01, 0.55, params={"model.decoder": "augseg"})
    claims = {c.id: c for c in check_claims(uri, "companions")}
    assert list(claims) == ["S0", "S0+", "S1", "C1", "C1+", "C2", "C2+", "C3", "C3+", "C4", "R1", "R2", "C5", "C6"]
    s0 = {p.name: p for p in claims["S0+"].parts}
    assert list(s0) == ["fixmatch", "unimatch"]
    assert s0["fixmatch"].against == "supervised_unimatch" and s0["fixmatch"].mean_diff == pytest.approx(8)
    assert s0["unimatch"].against == "supervised_unimatch" and s0["unimatch"].mean_diff == pytest.approx(11)
    paper_s0 = {p.name: p for p in claims["S0"].parts}
    assert paper_s0["augseg"].against == "supervised_augseg" and paper_s0["augseg"].mean_diff == pytest.approx(2)
    assert [p.name for p in claims["S0"].parts] == ["mt", "psmt", "u2pl", "augseg"]  # the paper's claim: its four
    verdicts = {key: claim.verdict for key, claim in claims.items()}
    assert {k: verdicts[k] for k in ("S0+", "C1+", "C2+", "C3+")} == {k: SUPPORTED for k in ("S0+", "C1+", "C2+", "C3+")}
    assert verdicts["C1"] == verdicts["C2"] == verdicts["C3"] == NO_DATA  # no head cells of the paper's frameworks
    assert claims["C1+"].pooled.mean_diff == pytest.approx(1) and claims["C1+"].pooled.pairs == 6
    assert [p.mean_diff for p in claims["C2+"].parts] == pytest.approx([2, 3])
    assert [p.name for p in claims["C3+"].parts] == ["1/16"] and claims["C3+"].pooled.mean_diff == pytest.approx(5)
    assert "FixMatch and UniMatch" in claims["S0+"].statement
    claims_command("companions", tracking=uri, out=tmp_path, emit=lambda text: None)
    markdown = (tmp_path / "claims.md").read_text()
    assert "| fixmatch vs supervised_unimatch | supported | +8.00 |" in markdown
    assert "| S0+ | **supported** | +9.50 |" in markdown
    data = json.loads((tmp_path / "claims.json").read_text())
    assert data[1]["per_framework"]["unimatch"]["against"] == "supervised_unimatch"
    rows = [(r.claim, r.label) for r in forest_rows(data)]
    assert ("S0+", "fixmatch vs supervised_unimatch") in rows and ("C3+", "1/16") in rows


def test_the_paper_claims_do_not_move_when_fixmatch_and_unimatch_cells_are_added():
    """The companions' cells (here also at a partition only they ran) change none of the paper's claims."""
    cells = _random_cells()
    rng = np.random.default_rng(7)
    extra = pd.DataFrame([{"replicate": replicate, "framework": framework, "framework_name": framework,
                           "decoder": "", "dataset": "study", "partition": partition, "head": head, "seed": str(s),
                           "miou": rng.uniform(0.2, 0.6), "pavpu": rng.uniform(0.4, 0.9)}
                          for replicate in ("a", "b") for framework in ("fixmatch", "unimatch")
                          for partition in ("1/16", "1/8") for head in ("baseline", "mc_dropout", "np")
                          for s in range(5)])
    paper = {c.id: c.to_dict() for c in cell_claims(cells)}
    both = {c.id: c.to_dict() for c in cell_claims(pd.concat([cells, extra], ignore_index=True))}
    assert list(paper) == ["S0", "S1", "C1", "C2", "C3", "C4", "R1"]
    assert list(both) == ["S0", "S0+", "S1", "C1", "C1+", "C2", "C2+", "C3", "C3+", "C4", "R1"]
    # R1 is per framework: it covers every framework with NP cells, the companions too
    assert {key: both[key] for key in paper if key != "R1"} == {key: v for key, v in paper.items() if key != "R1"}
    assert [p["name"] for p in both["C3+"]["parts"]] == ["1/16", "1/8"]
    assert [p["name"] for p in both["C3"]["parts"]] == ["1/16", "full"]


def _reliability_cell(client, experiment_id, framework, head, seed, *, ece, auroc, aurc, data_seed=None):
    options = {} if data_seed is None else {"data.options.seed": str(data_seed), "data.options.family": "study_textures"}
    run = client.create_run(experiment_id, tags={
        "npsemiseg.kind": "cell", "framework": framework, "dataset": "study", "partition": "1/16", "head": head,
        "seed": str(seed), "cell_id": f"{framework}-{head}-{seed}-{data_seed}"})
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in (
        ("miou", 0.5), ("pavpu", 0.5), ("ece", ece), ("auroc", auroc), ("aurc", aurc))],
        params=[Param(k, v) for k, v in options.items()])
    client.set_terminated(run.info.run_id, "FINISHED")


def test_a_study_run_again_at_another_data_seed_into_one_experiment_pools_both_instances(tmp_path_factory,
                                                                                                  tmp_path):
    """The mini study at data seeds 0 and 1 logged into one experiment: each data seed's cells are a dataset instance
    of their own (pairs within each, both pooled), not newer runs of the first's cells (which would leave only the
    second instance's three pairs, mean 3)."""
    uri = fresh_store(tmp_path_factory, "claims-instances")
    client = MlflowClient(uri)
    experiment = client.create_experiment("mini")
    for data_seed, gap in ((0, 0.01), (1, 0.03)):
        for seed in SEEDS:
            jitter = seed / 1000
            for head, ece in (("np", 0.04 + jitter), ("baseline", 0.04 + gap + jitter), ("mc_dropout", 0.06 + jitter)):
                _reliability_cell(client, experiment, "u2pl", head, seed, ece=ece, auroc=0.8, aurc=0.05,
                                  data_seed=data_seed)
    r1 = {c.id: c for c in check_claims(uri, "mini")}["R1"]
    ece_vs_baseline = {p.name: p for p in r1.parts}["u2pl: ece vs baseline"]
    assert ece_vs_baseline.pairs == 6
    assert sorted(ece_vs_baseline.diffs) == pytest.approx([1.0] * 3 + [3.0] * 3)
    claims_command("mini", tracking=uri, out=tmp_path, emit=lambda text: None)
    assert ("Runs: experiment `mini`. Dataset instances `family=study_textures,seed=0`, "
            "`family=study_textures,seed=1`: the two cells of a pair share one") in (tmp_path / "claims.md").read_text()


def test_r1_judges_ece_auroc_and_aurc_per_framework_against_both_heads(tmp_path_factory, tmp_path):
    """MT: NP 1 point lower ECE, 2 points higher AUROC, 0.5 lower AURC than both other heads (supported); U2PL: the
    same except that NP's AURC is 1 point higher than MC dropout's (that part contradicted, so R1 is)."""
    uri = fresh_store(tmp_path_factory, "claims-r1")
    client = MlflowClient(uri)
    experiment = client.create_experiment("r1")
    for seed in SEEDS:
        jitter = seed / 1000
        for framework in ("mt", "u2pl"):
            _reliability_cell(client, experiment, framework, "np", seed, ece=0.04 + jitter, auroc=0.80 + jitter,
                              aurc=0.050 + jitter)
            _reliability_cell(client, experiment, framework, "baseline", seed, ece=0.05 + 2 * jitter,
                              auroc=0.78 + 2 * jitter, aurc=0.055 + 2 * jitter)
            worse_aurc = 0.040 if framework == "u2pl" else 0.055
            _reliability_cell(client, experiment, framework, "mc_dropout", seed, ece=0.05 + 2 * jitter,
                              auroc=0.78 + 2 * jitter, aurc=worse_aurc + 2 * jitter)
    r1 = {c.id: c for c in check_claims(uri, "r1")}["R1"]
    parts = {p.name: p for p in r1.parts}
    assert len(parts) == 2 * 3 * 2
    assert parts["mt: ece vs baseline"].mean_diff == pytest.approx(1 + 0.1, abs=1e-9)  # (0.05 + 2j) - (0.04 + j)
    assert parts["mt: auroc vs mc_dropout"].mean_diff == pytest.approx(2 - 0.1, abs=1e-9)
    assert parts["mt: aurc vs baseline"].verdict == SUPPORTED and parts["mt: aurc vs baseline"].pairs == 3
    assert parts["u2pl: aurc vs mc_dropout"].mean_diff == pytest.approx(-1 + 0.1, abs=1e-9)
    assert parts["u2pl: aurc vs mc_dropout"].verdict == CONTRADICTED
    assert all(p.verdict == SUPPORTED for name, p in parts.items() if name != "u2pl: aurc vs mc_dropout")
    assert r1.verdict == CONTRADICTED and r1.pooled.pairs == 36
    claims_command("r1", tracking=uri, out=tmp_path, emit=lambda text: None)
    report = (tmp_path / "claims.md").read_text()
    assert "## R1:" in report and (tmp_path / FOREST_PLOT).exists()
    # the reliability table follows the claims: R1's numbers, per framework x head
    tables = report.split("## The reliability tables", 1)[1]
    assert "### Reliability: study, 1/16" in tables and "| MT | baseline |" in tables and "|  | MC dropout |" in tables

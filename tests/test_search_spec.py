"""Search specs, search identity, the sampler seed, the duplicate-free Optuna searcher and the
figure's per-value profile (unit tests: no Ray cluster, a real Optuna SQLite study)."""

from __future__ import annotations

import copy
from pathlib import Path

import optuna
import pytest
import yaml

from semiseg_platform.reports import profile
from semiseg_platform.sweeps.search_spec import load_search_spec, search_id
from semiseg_platform.sweeps.search_study import (
    CELL_ATTR,
    DUPLICATE_ATTR,
    FINAL_KEY,
    CellOfParams,
    StudySearch,
    evaluated_cells,
    sampler_seed,
)

SMOKE_SPEC = Path(__file__).resolve().parents[1] / "jobs" / "specs" / "search_smoke.yaml"
PAPER_SPEC = SMOKE_SPEC.with_name("search_np.yaml")


def _spec_data(**changes):
    data = yaml.safe_load(SMOKE_SPEC.read_text())
    data.update(changes)
    return data


def test_shipped_specs_load_and_reproduce_the_paper_space():
    smoke = load_search_spec(SMOKE_SPEC)
    assert smoke.asha is not None and smoke.asha.max_t == 4 and smoke.trials == 4
    paper = load_search_spec(PAPER_SPEC)
    assert (paper.framework, paper.dataset, paper.head) == ("u2pl", "pascal_blender", "np")
    assert 2560 in paper.space["head.options.memory_size"].choice
    assert paper.space["head.options.lambda_kl"].loguniform == (0.001, 0.1)
    assert paper.space["head.options.training_samples"].choice == [1, 2, 5, 10]
    cityscapes = load_search_spec(PAPER_SPEC, dataset="cityscapes", partition="1/8",
                                  overrides={"schedule.batch_size": "8"})
    base = cityscapes.base_config()
    assert (base.dataset, base.partition, base.schedule.batch_size) == ("cityscapes", "372", 8)


@pytest.mark.parametrize("changes, message", [
    ({"colour": "red"}, "colour: Extra inputs are not permitted"),
    ({"framework": "no_such_framework"}, "framework: unknown value 'no_such_framework'"),
    ({"metric": "accuracy"}, "metric: unknown value 'accuracy'"),
    ({"space": {"optim.lr": {"loguniform": [0.0, 0.1]}}}, "space.optim.lr: loguniform: expected low > 0"),
    ({"space": {"optim.lr": {"uniform": [0.1, 0.01]}}}, "uniform: expected [low, high] with low < high"),
    ({"space": {"optim.lr": {"choice": [0.1], "uniform": [0.1, 0.2]}}}, "expected exactly one of"),
    ({"space": {"optim.lr": {"choice": [0.1, 0.1]}}}, "choice: values must be distinct"),
    ({"space": {}}, "space: Dictionary should have at least 1 item"),
    ({"asha": {"grace_period": 5, "max_t": 4}}, "asha: grace_period: expected <= max_t (4), got 5"),
    ({"points_to_evaluate": [{"optim.lr": 0.01}]}, "points_to_evaluate[0]: expected a value for every key of space"),
])
def test_invalid_spec_names_the_key(changes, message):
    with pytest.raises(ValueError) as error:
        load_search_spec(_spec_data(**changes))
    assert message in str(error.value)
    assert str(error.value).startswith("search spec is invalid:")


def test_int_and_choice_distributions_map_to_optuna():
    spec = load_search_spec(_spec_data(space={"head.options.latent_dim": {"int": [4, 16]},
                                              "head.options.training_samples": {"choice": [1, 2]}}, points_to_evaluate=[]))
    latent = spec.space["head.options.latent_dim"].optuna()
    assert isinstance(latent, optuna.distributions.IntDistribution) and (latent.low, latent.high) == (4, 16)
    assert spec.space["head.options.training_samples"].optuna().choices == (1, 2)
    with pytest.raises(ValueError, match=r"space.head.options.latent_dim.int.0: Input should be a valid integer"):
        load_search_spec(_spec_data(space={"head.options.latent_dim": {"int": [4.5, 16]}}, points_to_evaluate=[]))


def test_space_values_that_the_config_rejects_are_named():
    with pytest.raises(ValueError, match=r"space.optim.momentum = 1.5 is not a valid setting"):
        load_search_spec(_spec_data(space={"optim.momentum": {"choice": [0.9, 1.5]}}, points_to_evaluate=[]))
    with pytest.raises(ValueError, match=r"space.optim.learning_rate = 0.1 is not a valid setting: .*unknown configuration key"):
        load_search_spec(_spec_data(space={"optim.learning_rate": {"choice": [0.1]}}, points_to_evaluate=[]))
    with pytest.raises(ValueError, match=r"the cell is invalid: .*partition"):
        load_search_spec(_spec_data(partition="7"))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_search_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n- not a mapping\n")
    with pytest.raises(ValueError, match=f"search spec {bad}: expected a mapping"):
        load_search_spec(bad)


def test_search_id_is_stable_and_follows_cell_space_and_objective():
    spec = load_search_spec(SMOKE_SPEC)
    same = load_search_spec(_spec_data(trials=9, seed=3))  # more trials / another seed: the same search
    assert search_id(spec) == search_id(same)
    assert search_id(spec) != search_id(load_search_spec(_spec_data(partition="1/8")))
    space = copy.deepcopy(_spec_data()["space"])
    space["head.options.training_samples"] = {"choice": [1, 2, 3]}
    assert search_id(spec) != search_id(load_search_spec(_spec_data(space=space)))
    assert search_id(spec) != search_id(load_search_spec(_spec_data(metric="pavpu")))


def test_sampler_seed_differs_once_the_study_has_trials():
    assert sampler_seed(7, 0) == 7
    assert sampler_seed(7, 4) == sampler_seed(7, 4) != sampler_seed(7, 5)
    assert sampler_seed(7, 4) != 7


def _two_config_search(tmp_path, evaluated_lr=None):
    """A StudySearch over a space of exactly two cells, on a real SQLite study."""
    spec = load_search_spec(_spec_data(space={"optim.lr": {"choice": [0.01, 0.02]}}, points_to_evaluate=[]))
    cell_of = CellOfParams(spec.base_config(), ("optim.lr",))
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(storage=storage, study_name="two", direction="maximize", load_if_exists=True)
    distributions = {"optim.lr": optuna.distributions.CategoricalDistribution([0.01, 0.02])}
    if evaluated_lr is not None:
        study.add_trial(optuna.trial.create_trial(params={"optim.lr": evaluated_lr}, distributions=distributions,
                                                  value=0.5))
    searcher = StudySearch(cell_of=cell_of, evaluated=evaluated_cells(study, cell_of), space=distributions,
                           metric="miou", mode="max", study_name="two", storage=storage,
                           sampler=optuna.samplers.RandomSampler(seed=0))
    return searcher, study, cell_of


def test_searcher_never_proposes_an_evaluated_or_running_cell(tmp_path):
    searcher, study, cell_of = _two_config_search(tmp_path, evaluated_lr=0.01)
    config = searcher.suggest("t1")
    assert config["optim.lr"] == 0.02 and config["cell_id"] == cell_of({"optim.lr": 0.02})
    # 0.01 is evaluated and 0.02 is running: nothing left to propose
    assert searcher.suggest("t2") == StudySearch.FINISHED
    duplicates = [t for t in study.trials if DUPLICATE_ATTR in t.user_attrs]
    assert duplicates and all(t.state == optuna.trial.TrialState.FAIL for t in duplicates)
    assert searcher.duplicates == len(duplicates)
    searcher.on_trial_complete("t1", {"miou": 0.7, FINAL_KEY: 1.0, "training_iteration": 1})
    proposed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.params["optim.lr"] for t in proposed) == [0.01, 0.02]
    assert {t.user_attrs.get(CELL_ATTR) for t in proposed if t.params["optim.lr"] == 0.02} == {config["cell_id"]}


def test_stopped_trial_is_pruned_with_its_intermediate_values(tmp_path):
    searcher, study, cell_of = _two_config_search(tmp_path)
    config = searcher.suggest("t1")
    searcher.on_trial_result("t1", {"miou": 0.1, "training_iteration": 1})
    searcher.on_trial_result("t1", {"loop_seconds": 3.0, "training_iteration": 2})  # no metric: ignored
    searcher.on_trial_complete("t1", {"miou": 0.1, "training_iteration": 1})  # no FINAL_KEY: stopped by ASHA
    trial = study.trials[-1]
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.intermediate_values == {1: 0.1}
    known = evaluated_cells(study, cell_of)
    assert known[config["cell_id"]].state == "PRUNED" and known[config["cell_id"]].value == 0.1


def test_profile_groups_discrete_values_and_bins_continuous_ones():
    xs, ys = profile([2, 1, 2, 5], [0.3, 0.1, 0.5, 0.2])
    assert xs == [1.0, 2.0, 5.0] and ys == [0.1, 0.5, 0.2]
    assert profile([2, 1, 2, 5], [0.3, 0.1, 0.5, 0.2], aggregate="mean")[1] == [0.1, 0.4, 0.2]
    lambdas = [0.001 * 1.5 ** i for i in range(12)]  # 12 distinct values over ~2 decades
    xs, ys = profile(lambdas, list(range(12)), max_points=4)
    assert len(xs) == 4 and xs == sorted(xs) and ys[-1] == 11
    assert all(0.001 <= x <= lambdas[-1] for x in xs)
    assert profile([None, None], [1.0, 2.0]) == ([], [])


def test_job_entry_point_exit_status(tmp_path, capsys):
    from jobs.search import main

    assert main([str(SMOKE_SPEC), "--dry-run", "--partition", "1/8"]) == 0
    assert "u2pl/synthetic_blender/1323/np" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_spec_data(trials=0)))
    assert main([str(bad)]) == 2
    assert "trials: Input should be greater than 0" in capsys.readouterr().err
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text(yaml.safe_dump(_spec_data(num_samples=4)))
    assert main([str(renamed)]) == 2
    assert "num_samples: the number of Tune trials is called trials" in capsys.readouterr().err
    assert main([str(SMOKE_SPEC), "--set", "optim.lr"]) == 2
    assert "--set: expected key=value" in capsys.readouterr().err


def test_default_optuna_storage_follows_the_stack_export(monkeypatch, tmp_path):
    from semiseg_platform.sweeps.search_spec import default_optuna_storage

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NPSEMISEG_OPTUNA_STORAGE", raising=False)
    assert default_optuna_storage() == f"sqlite:///{(tmp_path / 'optuna.db').resolve()}"
    monkeypatch.setenv("NPSEMISEG_OPTUNA_STORAGE", "postgresql://127.0.0.1:25432/optuna")
    assert default_optuna_storage() == "postgresql://127.0.0.1:25432/optuna"

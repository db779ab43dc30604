"""The Optuna side of a search: sampled values -> cells, what the study evaluated already, the
seeded TPE searcher that never trains a cell twice, and the study's best configuration."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch

from npsemiseg.config import RunConfig, with_overrides

#: Optuna user attributes of the study's trials
CELL_ATTR = "npsemiseg.cell_id"
DUPLICATE_ATTR = "npsemiseg.duplicate_of"
#: Key of a trial's last Tune result marking that the cell ran to its end (absent when ASHA stopped it)
FINAL_KEY = "cell_finished"
#: How many duplicate proposals in a row end the search (the space is exhausted or nearly)
MAX_DUPLICATE_PROPOSALS = 50


@dataclass(frozen=True)
class CellOfParams:
    """Maps sampled values to the trial's RunConfig and ``cell_id`` (picklable: Tune saves the searcher)."""

    base: RunConfig
    keys: tuple[str, ...]

    def config(self, params: Mapping[str, Any]) -> RunConfig:
        return with_overrides(self.base, {key: params[key] for key in self.keys})

    def __call__(self, params: Mapping[str, Any]) -> str:
        return self.config(params).cell_id


@dataclass(frozen=True)
class Evaluated:
    """A configuration the study already evaluated: its Optuna trial number, state and value
    (the last intermediate value of a PRUNED trial)."""

    number: int
    state: str
    value: float | None


def evaluated_cells(study: Any, cell_of: CellOfParams) -> dict[str, Evaluated]:
    """``cell_id -> Evaluated`` for the study's COMPLETE and PRUNED trials over exactly this space."""
    out: dict[str, Evaluated] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if set(trial.params) != set(cell_of.keys):
            continue
        try:
            cell_id = cell_of(trial.params)
        except (ValueError, TypeError):  # a value the current code rejects: not this search's cell
            continue
        if trial.state == TrialState.COMPLETE:
            value = trial.value
        else:
            steps = sorted(trial.intermediate_values)
            value = trial.intermediate_values[steps[-1]] if steps else None
        out.setdefault(cell_id, Evaluated(trial.number, trial.state.name, value))
    return out


def sampler_seed(seed: int, trials_in_study: int) -> int:
    """The TPE seed of one submission: ``seed`` for a new study, else derived from the study's size,
    so a continued study draws new values instead of replaying the first submission's."""
    if trials_in_study == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{trials_in_study}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class StudySearch(OptunaSearch):
    """``OptunaSearch`` that never proposes a cell the study already evaluated (or that is running),
    tells trials stopped by the scheduler as PRUNED, and records each trial's ``cell_id``.

    Uses ``OptunaSearch``'s ``_ot_study`` / ``_ot_trials`` (Ray 2.60) to re-ask after a duplicate.
    """

    def __init__(self, *, cell_of: CellOfParams, evaluated: Mapping[str, Evaluated], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cell_of = cell_of
        self.evaluated = dict(evaluated)
        self.running: dict[str, str] = {}  # cell_id -> Tune trial id
        self.cells: dict[str, str] = {}  # Tune trial id -> cell_id
        self.numbers: dict[str, int] = {}  # Tune trial id -> Optuna trial number
        self.duplicates = 0

    def suggest(self, trial_id: str) -> dict | None:
        for _ in range(MAX_DUPLICATE_PROPOSALS):
            config = super().suggest(trial_id)
            if not isinstance(config, dict):
                return config
            params = {key: config[key] for key in self.cell_of.keys}
            cell_id = self.cell_of(params)
            ot_trial = self._ot_trials[trial_id]
            ot_trial.set_user_attr(CELL_ATTR, cell_id)
            known = self.evaluated.get(cell_id)
            if known is None and cell_id not in self.running:
                self.running[cell_id] = trial_id
                self.cells[trial_id] = cell_id
                self.numbers[trial_id] = ot_trial.number
                return {**config, "cell_id": cell_id, "optuna_trial": ot_trial.number}
            # already evaluated (or being evaluated): record the proposal, never train the cell twice
            original = f"trial {known.number}" if known is not None else f"Tune trial {self.running[cell_id]}"
            ot_trial.set_user_attr(DUPLICATE_ATTR, f"{cell_id} ({original})")
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
            del self._ot_trials[trial_id]
            self.duplicates += 1
        return OptunaSearch.FINISHED

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self.metric in result and trial_id in self._ot_trials:
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self._ot_trials:
            return
        cell_id = self.cells.get(trial_id)
        self.running.pop(cell_id, None)
        if error or not result or result.get(FINAL_KEY):
            super().on_trial_complete(trial_id, result, error)
        else:  # stopped by the scheduler before the cell's end: PRUNED, with its intermediate values
            self._ot_study.tell(self._ot_trials[trial_id], state=TrialState.PRUNED)
            self._completed_trials.add(trial_id)
        if cell_id is not None and not error:
            value = (result or {}).get(self.metric)
            self.evaluated[cell_id] = Evaluated(self.numbers.get(trial_id, -1), "COMPLETE" if (result or {}).get(FINAL_KEY)
                                                else "PRUNED", value)


def best_config(study: Any, cell_of: CellOfParams) -> tuple[RunConfig, Any] | None:
    """The configuration of the study's best COMPLETE trial over this space, with that trial (None if none)."""
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if set(t.params) == set(cell_of.keys) and t.value is not None and math.isfinite(t.value)]
    if not complete:
        return None
    pick = max if study.direction.name == "MAXIMIZE" else min
    trial = pick(complete, key=lambda t: t.value)
    return cell_of.config(trial.params), trial

"""The statistics and pairing of the claims report (:mod:`.claims` defines the claims).

A *pair* is two finished cell runs that differ only in what a claim compares (same replicate, dataset instance,
dataset, partition and seed, and the same framework unless the framework is what is compared): :func:`paired_diffs`. Over the
differences of the pairs: the mean, a 95 % percentile bootstrap interval (seeded; the differences are sorted
first, so that the same runs give the same interval whatever order MLflow returns them in) and a verdict
(:func:`verdict_of`); a claim made of parts combines the parts' verdicts (:func:`combine_verdicts`). S0's
pairs need the supervised reference of each framework: :func:`supervised_reference`. Unpaired comparisons
(C6's search trials) resample each group: :func:`unpaired`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from semiseg_platform.reports.tables import COMPANION_FRAMEWORKS, DATA_INSTANCE, PAPER_FRAMEWORKS, latest_per_cell

SUPPORTED, CONTRADICTED, INCONCLUSIVE, NO_DATA = "supported", "contradicted", "inconclusive", "no data"
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
#: the column naming the experiment a cell came from: pairs never cross it
REPLICATE = "replicate"


@dataclass
class Evidence:
    """One comparison's differences and what they say (``name`` labels a part)."""

    name: str
    diffs: list[float] = field(default_factory=list)
    mean_diff: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str = NO_DATA
    count: int | None = None  # unpaired comparisons: runs compared (else the number of differences)
    against: str = ""  # what the part was compared with, where the claim's statement does not say (S0's reference)

    @property
    def pairs(self) -> int:
        return len(self.diffs) if self.count is None else self.count

    @property
    def label(self) -> str:
        return f"{self.name} vs {self.against}" if self.against else self.name

    def summary(self) -> dict:
        out = {"name": self.name, "verdict": self.verdict, "mean_diff": self.mean_diff, "ci_low": self.ci_low,
               "ci_high": self.ci_high, "pairs": self.pairs}
        if self.against:
            out["against"] = self.against
        return out


@dataclass
class Claim:
    """A claim of the paper with its evidence: ``parts`` (``by`` says what they are per) and the pooled numbers."""

    id: str
    statement: str
    source: str
    unit: str
    by: str = ""
    parts: list[Evidence] = field(default_factory=list)
    pooled: Evidence = field(default_factory=lambda: Evidence("all"))
    detail: list[Evidence] = field(default_factory=list)  # shown, not part of the verdict

    @property
    def verdict(self) -> str:
        return combine_verdicts([p.verdict for p in self.parts]) if self.parts else self.pooled.verdict

    def to_dict(self) -> dict:
        """The JSON object of ``claims.json``."""
        out = {"id": self.id, "verdict": self.verdict, "mean_diff": self.pooled.mean_diff, "ci_low": self.pooled.ci_low,
               "ci_high": self.pooled.ci_high, "pairs": self.pooled.pairs, "statement": self.statement,
               "source": self.source, "unit": self.unit, "parts_by": self.by,
               "parts": [p.summary() for p in self.parts], "detail": [d.summary() for d in self.detail]}
        if self.by == "framework":
            out["per_framework"] = {p.name: p.summary() for p in self.parts or self.detail}
        return out


def bootstrap_interval(diffs: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diffs`` (resampled with replacement, seeded).

    A function of the differences alone, not of their order: they are sorted before resampling, so the same
    runs give the same interval whatever order MLflow returns them in.
    """
    values = np.sort(np.asarray(diffs, dtype=float))
    if values.size == 0:
        raise ValueError("bootstrap_interval: expected at least one difference, got none")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def verdict_of(ci_low: float | None, ci_high: float | None, pairs: int) -> str:
    if pairs == 0:
        return NO_DATA
    if pairs < 2 or ci_low is None or ci_high is None:
        return INCONCLUSIVE
    return SUPPORTED if ci_low > 0 else CONTRADICTED if ci_high < 0 else INCONCLUSIVE


def combine_verdicts(verdicts: Iterable[str]) -> str:
    """All parts supported -> supported; one contradicted -> contradicted; all no data -> no data."""
    verdicts = list(verdicts)
    if not verdicts or all(v == NO_DATA for v in verdicts):
        return NO_DATA
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return SUPPORTED if all(v == SUPPORTED for v in verdicts) else INCONCLUSIVE


def evidence(name: str, diffs: Sequence[float]) -> Evidence:
    """Mean, interval and verdict of one list of differences."""
    diffs = [float(d) for d in diffs if not math.isnan(float(d))]
    if not diffs:
        return Evidence(name)
    low, high = bootstrap_interval(diffs)
    return Evidence(name, diffs, float(np.mean(diffs)), low, high, verdict_of(low, high, len(diffs)))


def pool_parts(claim: Claim) -> Claim:
    claim.pooled = evidence("all", [d for p in claim.parts for d in p.diffs])
    return claim



# ----------------------------------------------------------------------------- pairs


def finished_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """The latest finished run per (dataset instance, framework, dataset, partition, head, seed) (ties in time: the
    larger run id): a cell run again at another data seed is a cell of its own, not a newer run of the first."""
    cells = latest_per_cell(runs)
    cells = cells.sort_values(["end_time", "start_time", "run_id"], na_position="first", kind="stable")
    keys = [k for k in (DATA_INSTANCE, "framework", "dataset", "partition", "head", "seed") if k in cells.columns]
    return cells.drop_duplicates(keys, keep="last")


def paired_diffs(cells: pd.DataFrame, metric: str, better: dict, worse: dict, *, scale: float = 100.0,
                 where: dict | None = None) -> list[float]:
    """``scale x (metric of better - metric of worse)`` over the pairs sharing every other cell key.

    ``better`` / ``worse`` select each side (e.g. ``{"head": "np"}`` / ``{"head": "baseline"}``);
    ``where`` restricts both sides (e.g. ``{"partition": "1/16"}``). The differences come in the order of the
    pairs' key (replicate, framework, dataset, partition, head, seed, less what the sides select), not in the
    order of ``cells`` (MLflow's search order): the same runs give the same list. Pairs never cross replicates or
    dataset instances (:data:`~.tables.DATA_INSTANCE`).
    """
    keys = [k for k in (REPLICATE, DATA_INSTANCE, "framework", "dataset", "partition", "head", "seed")
            if k not in better and k in cells.columns]

    def side(selection: dict) -> pd.DataFrame:
        chosen = cells
        for key, value in {**(where or {}), **selection}.items():
            chosen = chosen[chosen[key].isin(value if isinstance(value, (list, tuple)) else [value])]
        return chosen[keys + [metric]]

    merged = side(better).merge(side(worse), on=keys, suffixes=("_a", "_b"))
    merged = merged.sort_values(keys, kind="stable") if keys else merged
    return [scale * (a - b) for a, b in zip(merged[f"{metric}_a"], merged[f"{metric}_b"])]


def per_part(name_values: Iterable[str], diffs_of: Callable[[str], list[float]]) -> list[Evidence]:
    """One part per name, from the differences ``diffs_of(name)``."""
    return [evidence(name, diffs_of(name)) for name in name_values]


#: frameworks whose supervised reference is named after another framework: FixMatch is the baseline of UniMatch's
#: own code (its fixmatch.py: the same network, UniMatch less its feature-perturbation and second strong view), so
#: both are compared with ``supervised_unimatch``
REFERENCE_NAMED_AFTER = {"fixmatch": "unimatch"}


def reference_label(framework: str) -> str:
    """The label of the supervised variant that is ``framework``'s own reference (``supervised_<name>``)."""
    return f"supervised_{REFERENCE_NAMED_AFTER.get(framework, framework)}"


def supervised_reference(cells: pd.DataFrame, framework: str) -> tuple[str, str]:
    """The supervised cells S0 compares ``framework``'s baseline cells with, as (framework label, description).

    The framework's own reference when the grid ran it: the supervised variant named for it
    (:func:`reference_label`: ``supervised_psmt`` for PS-MT, ``supervised_unimatch`` for UniMatch and FixMatch),
    trained on the framework's network so that the difference is the framework's use of unlabeled images and not
    its decoder. Else a supervised variant on the framework's network (``model.decoder``; the plain ``supervised``
    first). The network alone does not name the reference: two variants can share one (``supervised_augseg`` and
    ``supervised_unimatch`` both train AugSeg's decoder). Else the plain ``supervised`` cells, described with both
    networks.
    """
    baseline = cells[cells["head"] == "baseline"]
    networks = set(baseline.loc[baseline["framework"] == framework, "decoder"]) - {""}
    references = baseline[baseline["framework_name"] == "supervised"]
    matching = sorted(set(references.loc[references["decoder"].isin(networks), "framework"]))
    if reference_label(framework) in set(references["framework"]):
        label = reference_label(framework)
    else:
        label = "supervised" if not matching or "supervised" in matching else matching[0]
    reference_networks = set(references.loc[references["framework"] == label, "decoder"]) - {""}
    if not networks or not reference_networks or networks == reference_networks:
        return label, label
    return label, (f"{label} (network {', '.join(sorted(reference_networks))}; {framework}'s is "
                   f"{', '.join(sorted(networks))}: the difference includes the network)")


def s0_evidence(cells: pd.DataFrame, framework: str) -> Evidence:
    """S0's part for one framework: its baseline cells minus those of its supervised reference."""
    label, description = supervised_reference(cells, framework)
    part = evidence(framework, paired_diffs(cells, "miou", {"framework": framework}, {"framework": label},
                                            where={"head": "baseline"}))
    part.against = description
    return part


def unpaired(name: str, good: Sequence[float], bad: Sequence[float], *, scale: float = 100.0) -> Evidence:
    """Difference of means ``good - bad`` with a bootstrap resampling each group (runs, not pairs)."""
    good, bad = np.sort(np.asarray(good, dtype=float)), np.sort(np.asarray(bad, dtype=float))  # order-free
    if good.size == 0 or bad.size == 0:
        return Evidence(name)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = (good[rng.integers(0, good.size, (BOOTSTRAP_RESAMPLES, good.size))].mean(1)
             - bad[rng.integers(0, bad.size, (BOOTSTRAP_RESAMPLES, bad.size))].mean(1))
    low, high = (scale * v for v in np.percentile(draws, [2.5, 97.5]))
    runs = int(good.size + bad.size)
    verdict = verdict_of(low, high, runs) if min(good.size, bad.size) >= 2 else INCONCLUSIVE
    return Evidence(name, [], float(scale * (good.mean() - bad.mean())), float(low), float(high), verdict, runs)


def reliability_frameworks(cells: pd.DataFrame) -> list[str]:
    """The frameworks with NP-SemiSeg cells, supervised included, in the tables' order (the paper's, then the
    companions, then others): the frameworks R1 and R2 judge."""
    found = set(cells.loc[cells["head"] == "np", "framework"]) if len(cells) else set()
    ordered = [f for f in (*PAPER_FRAMEWORKS, *COMPANION_FRAMEWORKS) if f in found]
    return ordered + sorted(found - set(ordered))

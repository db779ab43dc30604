"""The paper's own numbers (Tables 1-6 of ``np_semiseg_icml2023.tex``), shipped as data: ``paper_results.csv``.

One row per printed value: ``table`` (the first table printing it), ``dataset``, ``framework``, ``head``
(variant: ``baseline``, ``mc_dropout``, ``np``, ``np_mean``), ``partition`` (labeled count), ``metric``
(``miou`` | ``pavpu``) and ``value`` (percent, as printed). Values printed twice (U2PL + NP in Tables 1-3
and 5, Tables 4 and 6) are equal in the paper and kept once per key.
"""

from __future__ import annotations

import csv
import functools
import io
from importlib import resources

PAPER_RESULTS_FILE = "paper_results.csv"


@functools.cache
def paper_results() -> dict[tuple[str, str, str, str, str], float]:
    """``{(dataset, framework, head, partition, metric): value}`` (percent) of every value the paper prints."""
    text = resources.files(__package__).joinpath(PAPER_RESULTS_FILE).read_text(encoding="utf-8")
    out: dict[tuple[str, str, str, str, str], float] = {}
    for row in csv.DictReader(io.StringIO(text)):
        key = (row["dataset"], row["framework"], row["head"], row["partition"], row["metric"])
        out.setdefault(key, float(row["value"]))
    return out


def paper_value(dataset: str, framework: str, head: str, partition: str, metric: str) -> float | None:
    """The paper's value of one cell (percent), or None where the paper prints none."""
    return paper_results().get((dataset, framework, head, partition, metric))

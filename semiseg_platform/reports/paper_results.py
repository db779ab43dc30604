"""The paper's own numbers (Tables 1-6 of ``np_semiseg_icml2023.tex``), shipped as data: ``paper_results.csv``;
and UniMatch V2's published numbers for its rows (``unimatch_v2_results.csv``).

One row per printed value: ``table`` (the first table printing it), ``dataset``, ``framework``, ``head``
(variant: ``baseline``, ``mc_dropout``, ``np``, ``np_mean``), ``partition`` (labeled count), ``metric``
(``miou`` | ``pavpu``) and ``value`` (percent, as printed). Values printed twice (U2PL + NP in Tables 1-3
and 5, Tables 4 and 6) are equal in the paper and kept once per key.

UniMatch V2 (Yang et al., 2024; LiheYoung/UniMatch-V2@f6afb4d): its Tables 1-4 (``table``), the best EMA mIoU of
each run's training log rounded as printed, DINOv2-B as framework ``unimatch_v2`` (the README's tables, equal to the
logs rounded) and DINOv2-S as ``unimatch_v2_s`` (the logs); head ``baseline`` (the official network has a plain
classifier); ``source`` names the log file and README line of each value.
"""

from __future__ import annotations

import csv
import functools
import io
from importlib import resources

PAPER_RESULTS_FILE = "paper_results.csv"
UNIMATCH_V2_RESULTS_FILE = "unimatch_v2_results.csv"
#: ``(dataset, framework, head, partition, metric)``
Key = tuple[str, str, str, str, str]


def _rows(name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))))


def _key(row: dict[str, str]) -> Key:
    return row["dataset"], row["framework"], row["head"], row["partition"], row["metric"]


@functools.cache
def paper_results() -> dict[Key, float]:
    """``{(dataset, framework, head, partition, metric): value}`` (percent) of every value the paper prints."""
    out: dict[Key, float] = {}
    for row in _rows(PAPER_RESULTS_FILE):
        out.setdefault(_key(row), float(row["value"]))
    return out


@functools.cache
def unimatch_v2_results() -> dict[Key, tuple[float, str]]:
    """``{key: (value, source)}`` of UniMatch V2's published mIoU (percent) and where each is printed / logged."""
    return {_key(row): (float(row["value"]), row["source"]) for row in _rows(UNIMATCH_V2_RESULTS_FILE)}


def paper_value(dataset: str, framework: str, head: str, partition: str, metric: str) -> float | None:
    """The published value of one cell (percent): the paper's, else UniMatch V2's for its rows; None where neither
    prints one."""
    key = (dataset, framework, head, partition, metric)
    if key in paper_results():
        return paper_results()[key]
    published = unimatch_v2_results().get(key)
    return None if published is None else published[0]

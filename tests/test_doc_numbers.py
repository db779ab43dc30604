"""The headline numbers of the README and the answer pages are the numbers of the reports that produced them, and
their lists of datasets and frameworks are the registries'.

A number is tied to its report by an HTML comment (invisible on the rendered page) after it, in its paragraph::

    C1 contradicted: -3.3 points <!-- numbers: docs/figures/claims_shipped_seed0.json C1 -3.3 contradicted -->

``docs/figures/claims_*.json`` is a claims report (``npsemiseg claims`` writes it as ``claims.json``); a ``.csv``
of per-cell validation mIoU (``miou_x100``) is a run's per-seed table, from which the claims are computed here by
the report's own code (``cell_claims``). An entry is ``KEY VALUE [INTERVAL] [VERDICT]``, entries separated by
``;``: KEY a claim id (its pooled numbers) or ``id/part`` (a framework's part or detail, e.g. ``S0+/unimatch``),
VALUE the mean difference as printed (its decimals are the rounding checked), INTERVAL ``[low, high]``. A
benchmark's records (``benchmarks/figures/*.jsonl``, one JSON object a line) are read by KEY ``field@name=value,...``:
the field of the one record with those values (``uncertainty_seconds@eval_mode=center_crop,head=np,num_samples=20``),
VALUE printed with or without a sign. Each printed value must stand in the paragraph before its comment. In the
headline passages (the README's Answers section, each answer page's text before its first ``##`` heading) every
signed decimal of a paragraph or bullet must carry such a comment: a new headline number cannot be written without
its source.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pandas as pd
import pytest

from npsemiseg.data import DATASETS, dataset_info
from npsemiseg.frameworks import FRAMEWORKS
from semiseg_platform.reports.claims import cell_claims
from semiseg_platform.reports.tables import FRAMEWORK_LABELS

ROOT = Path(__file__).resolve().parents[1]
#: the pages whose lead answers a question (docs/*.md but the changelog, the generated and reference pages)
ANSWER_PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in {"CHANGELOG.md", "PROTOCOL.md"})
PAGES = [ROOT / "README.md", *ANSWER_PAGES]
#: where a marked number may stand: the pages above and the history they moved to
MARKED_PAGES = [*PAGES, *sorted((ROOT / "docs" / "history").glob("*.md"))]
MARKER = re.compile(r"<!--\s*numbers:\s*(\S+)\s+(.*?)\s*-->", re.S)
NUMBER = r"[+-]\d+(?:\.\d+)?"
ENTRY = re.compile(rf"^(?P<key>\S+)\s+(?P<value>[+-]?\d+(?:\.\d+)?)(?:\s+(?P<interval>\[{NUMBER}, {NUMBER}\]))?"
                   r"(?:\s+(?P<verdict>supported|contradicted|inconclusive))?$")
SIGNED = re.compile(r"(?<![\w.])[+-]\d+\.\d+")


@cache
def report(relative: str) -> dict[str, dict] | list[dict]:
    """A claims report's claims and their parts by key (``C1``, ``S0+/unimatch``); a benchmark's records (``.jsonl``)."""
    path = ROOT / relative
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".csv":
        cells = pd.read_csv(path, dtype={"partition": str})
        cells["miou"] = cells.pop("miou_x100") / 100
        cells["pavpu"] = float("nan")  # not kept: the claims on PAvPU (C3, C3+) have no pairs here
        claims = [claim.to_dict() for claim in cell_claims(cells)]
    else:
        claims = json.loads(path.read_text())
    keyed = {}
    for claim in claims:
        keyed[claim["id"]] = claim
        for part in claim.get("parts", []) + claim.get("detail", []):
            keyed[f"{claim['id']}/{part['name']}"] = part
    return keyed


def paragraphs(text: str) -> list[tuple[int, str]]:
    """``(first line number, text)`` of each paragraph, bullet and table row (a bullet ends at the next one)."""
    blocks, current, start = [], [], 0
    for number, line in enumerate(text.splitlines(), 1):
        new_block = not line.strip() or re.match(r"\s*([-*] |\d+\. |\|)", line) or line.startswith("#")
        if new_block and current:
            blocks.append((start, "\n".join(current)))
            current = []
        if line.strip():
            if not current:
                start = number
            current.append(line)
    if current:
        blocks.append((start, "\n".join(current)))
    return blocks


def fmt(value: float, digits: int, sign: str = "+") -> str:
    return f"{value:{sign}.{digits}f}"


def lookup(source: dict[str, dict] | list[dict], key: str) -> dict | str:
    """The claim (or part) ``key`` of a claims report; for a benchmark's records, ``field@name=value,...``: the field
    of the one record with those values, as ``{"mean_diff": value}``. A string says why there is none."""
    if isinstance(source, dict):
        return source.get(key, f"the report has no {key} (it has {sorted(source)})")
    field, _, selection = key.partition("@")
    wanted = dict(pair.split("=", 1) for pair in selection.split(",") if pair)
    records = [r for r in source if all(str(r.get(k)) == v for k, v in wanted.items()) and field in r]
    return {"mean_diff": records[0][field]} if len(records) == 1 else f"{len(records)} records have {key}, not 1"


def decimals(written: str) -> int:
    return len(written.split(".")[1]) if "." in written else 0


def marker_problems(page: Path) -> list[str]:
    """``page:line: what`` for each marked number that is not its report's, or not printed before its marker."""
    problems = []
    for line, block in paragraphs(page.read_text(encoding="utf-8")):
        for match in MARKER.finditer(block):
            source, printed = match.group(1), block[:match.start()]
            where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name}:{line}"
            if not (ROOT / source).is_file():
                problems.append(f"{where}: no report {source}")
                continue
            for entry in filter(None, (e.strip() for e in match.group(2).split(";"))):
                problems += [f"{where}: {source} {entry}: {p}" for p in entry_problems(entry, report(source), printed)]
    return problems


def entry_problems(entry: str, claims: dict[str, dict] | list[dict], printed: str) -> list[str]:
    parsed = ENTRY.match(entry)
    if not parsed:
        return ["not KEY VALUE [INTERVAL] [VERDICT]"]
    key, value, interval, verdict = parsed.group("key", "value", "interval", "verdict")
    found, problems = lookup(claims, key), []
    if isinstance(found, str):
        return [found]
    sign = "+" if value[0] in "+-" else ""
    if found.get("mean_diff") is None or fmt(found["mean_diff"], decimals(value), sign) != value:
        problems.append(f"the report says {found.get('mean_diff')}")
    if interval:
        digits = decimals(interval.split(",")[0])
        actual = f"[{fmt(found['ci_low'], digits)}, {fmt(found['ci_high'], digits)}]"
        if actual != interval:
            problems.append(f"the report's interval is {actual}")
    if verdict and verdict != found["verdict"]:
        problems.append(f"the report's verdict is {found['verdict']}")
    for text in filter(None, (value, interval, verdict)):
        if text not in printed:
            problems.append(f"{text!r} is not printed before the marker")
    return problems


def headline(page: Path) -> str:
    """The README's Answers section; an answer page's text before its first ``##`` heading."""
    text = page.read_text(encoding="utf-8")
    if page.name == "README.md":
        return text.split("\n## Answers\n", 1)[1].split("\n## ", 1)[0]
    return text.split("\n## ", 1)[0]


def unsourced(page: Path) -> list[str]:
    """Signed decimals of the page's headline passage that no marker of their paragraph names."""
    found = []
    for _, block in paragraphs(headline(page)):
        if block.startswith("|") and "<!--" not in block:
            continue  # a table row is checked where it is marked
        marked = " ".join(m.group(2) for m in MARKER.finditer(block))
        text = MARKER.sub("", block)
        found += [f"{page.name}: {n} in {text[:60]!r}..." for n in SIGNED.findall(text) if n not in marked]
    return found


@pytest.mark.parametrize("page", MARKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_marked_number_is_its_reports(page):
    assert marker_problems(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_headline_number_names_its_report(page):
    assert unsourced(page) == []


def test_the_checks_catch_a_wrong_a_missing_and_an_unmarked_number(tmp_path):
    claims = report("docs/figures/claims_shipped_seed0.json")
    assert entry_problems("C1 -3.3 contradicted", claims, "C1 contradicted: -3.3 points") == []
    assert entry_problems("C1+ -3.5", claims, "-3.5 on FixMatch")[0].startswith("the report says -3.19")
    assert entry_problems("C1 -3.29 [-4.96, -1.72]", claims, "-3.29 [-4.96, -1.72]") == []
    assert entry_problems("C1 -3.3", claims, "C1 is below") == ["'-3.3' is not printed before the marker"]
    assert entry_problems("C9 -3.3", claims, "-3.3")[0].startswith("the report has no C9")
    page = tmp_path / "page.md"
    page.write_text("# A page\n\nUniMatch -5.3 (contradicted).\n\n## Body\n")
    assert unsourced(page) == ["page.md: -5.3 in 'UniMatch -5.3 (contradicted).'..."]
    page.write_text("# A page\n\nUniMatch -5.3, contradicted <!-- numbers: docs/figures/claims_shipped_seed0.json "
                    "S0+/unimatch -5.3 contradicted -->.\n")
    assert unsourced(page) == [] and marker_problems(page) == []
    page.write_text("# A page\n\nUniMatch -2.7 <!-- numbers: docs/figures/claims_shipped_seed0.json "
                    "S0+/unimatch -2.7 -->.\n")
    problems = marker_problems(page)
    assert len(problems) == 1 and problems[0].startswith("page.md:3: docs/figures/claims_shipped_seed0.json "
                                                         "S0+/unimatch -2.7: the report says -5.26")


def test_a_benchmark_record_is_found_by_its_fields():
    records = report("benchmarks/figures/uncertainty_time_c5.jsonl")
    key = "uncertainty_seconds@eval_mode=center_crop,head=np,num_samples=20"
    assert entry_problems(f"{key} 3.37", records, "3.37 s") == []
    assert entry_problems(f"{key} 3.36", records, "3.36 s")[0].startswith("the report says 3.365")
    assert entry_problems("uncertainty_seconds@head=np 3.37", records, "3.37") == ["8 records have "
                                                                                 "uncertainty_seconds@head=np, not 1"]


def test_the_csv_report_is_computed_by_the_reports_code():
    """The 2026-11-27 per-seed table gives the numbers its run's report printed (means exact; the printed
    intervals came from unrounded mIoU, so they may differ in the last digit)."""
    claims = report("docs/figures/cells_unimatch_seed0_2026-11-27.csv")
    assert fmt(claims["S0+/unimatch"]["mean_diff"], 2) == "-2.67" and claims["S0+/unimatch"]["verdict"] == "contradicted"
    assert fmt(claims["S0+/fixmatch"]["mean_diff"], 2) == "-1.64" and claims["C1+"]["verdict"] == "contradicted"
    assert (fmt(claims["C1+/fixmatch"]["mean_diff"], 2), fmt(claims["C1+/unimatch"]["mean_diff"], 2)) == ("-3.38",
                                                                                                        "-3.67")


# ----------------------------------------------------------------------------- lists of datasets and frameworks
def passage(relative: str, start: str, end: str) -> str:
    text = (ROOT / relative).read_text(encoding="utf-8")
    return text.split(start, 1)[1].split(end, 1)[0]


def names_a_dataset(text: str, name: str) -> bool:
    """A dataset is named by its name, its label (less a parenthesis: "VOC") or, for a generated stand-in, the
    word "synthetic"."""
    label = re.sub(r"\s*\(.*\)", "", DATASETS.get(name).label)
    return name in text or label in text or (dataset_info(name).synthetic and "synthetic" in text)


def names_a_framework(text: str, name: str) -> bool:
    """A framework is named by its name or its tables' label (less a parenthesis: "FixMatch")."""
    label = re.sub(r"\s*\(.*\)", "", FRAMEWORK_LABELS.get(name, name))
    return f"`{name}`" in text or f"({name})" in text or bool(
        re.search(rf"(?<![\w-]){re.escape(label)}(?![\w-])", text, re.IGNORECASE))


LISTS = {
    "README.md, the library's bullet": ("README.md", "- `npsemiseg`, the research library", "- `semiseg_platform`"),
    "docs/layout.md, frameworks/ and data/": ("docs/layout.md", "frameworks/ ", "evaluation/ "),
}


@pytest.mark.parametrize("where", sorted(LISTS))
def test_the_lists_name_every_registered_dataset_and_framework(where):
    text = " ".join(passage(*LISTS[where]).split())
    assert [n for n in DATASETS.names() if not names_a_dataset(text, n)] == []
    assert [n for n in FRAMEWORKS.names() if not names_a_framework(text, n)] == []


def test_the_data_package_docstring_names_every_registered_dataset():
    import npsemiseg.data

    text = " ".join(npsemiseg.data.__doc__.split("\n\n")[0].split())
    assert [n for n in DATASETS.names() if not names_a_dataset(text, n)] == []

"""The command line of ``benchmarks/official_runs.py``: its arguments, the frameworks a run trains and their patches
(:data:`PATCHES_OF`), the sides of one seed (:func:`one_framework`) and the whole run (:func:`run_all`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from npsemiseg.config import RunConfig

import official
from official.augseg import AUGSEG_PATCHES, NP_AUGSEG_PATCHES, official_augseg_run, official_np_augseg_run
from official.mt_cps import MT_CPS_PATCHES, official_mt_cps_run
from official.psmt import PSMT_PATCHES, run_official_psmt
from official.report import combine, plot_curves, provenance, records, with_verdict
from official.study import (LAYOUT, OFFICIAL, SIDES, SUPERVISED, V2, export_official_layout, official_epochs,
                            project_config, project_run, study_of)
from official.u2pl import NP_U2PL_PATCHES, U2PL_PATCHES, U2PL_SUP_PATCHES, official_np_u2pl_run, official_u2pl_run, \
    official_u2pl_sup_run
from official.unimatch import PATCHES, official_unimatch_run
from official.v2 import V2_PATCHES, official_v2_run
from official_side_by_side import checkout

PATCHES_OF = {"supervised": PATCHES, "fixmatch": PATCHES, "unimatch": PATCHES, "u2pl": U2PL_PATCHES,
              "augseg": AUGSEG_PATCHES, "psmt": PSMT_PATCHES, "mt_cps": MT_CPS_PATCHES,
              "supervised_u2pl": U2PL_SUP_PATCHES, **dict.fromkeys(V2, V2_PATCHES),
              "np_u2pl": NP_U2PL_PATCHES, "np_augseg": NP_AUGSEG_PATCHES}
#: the official run of a framework whose script is not UniMatch's (:func:`official_unimatch_run`) or V2's
RUNS = {"u2pl": official_u2pl_run, "augseg": official_augseg_run, "np_u2pl": official_np_u2pl_run,
        "np_augseg": official_np_augseg_run, "mt_cps": official_mt_cps_run, "supervised_u2pl": official_u2pl_sup_run}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=official.__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, help="folder of <owner>+<repo> checkouts")
    parser.add_argument("--framework", choices=sorted(OFFICIAL))
    parser.add_argument("--data-seed", type=int, default=0, help="the study dataset's instance")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--no-supervised", action="store_true", help="leave the supervised reference out")
    parser.add_argument("--steps", type=int, default=None,
                        help="iterations per run, a multiple of the epoch's (default: the mini study's 960)")
    parser.add_argument("--side", choices=SIDES, default=None,
                        help="run one side only (the sides of a seed in parallel processes; --combine joins them)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the mini study runs on 1)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of both sides' runs changed from the mini study's (a regime: e.g. "
                             "data.options.image_size=96, schedule.crop_size=96, data.options.train_size=2048; "
                             "VALUE read as YAML); repeat it")
    parser.add_argument("--split", choices=("val", "tune"), default="val",
                        help="the split both sides evaluate: val (what is reported) or tune (what regimes are "
                             "chosen on)")
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                        help="no runs: combine these official_runs.json (seeds run in parallel processes) into --out")
    parser.add_argument("--figure", type=Path, default=None, metavar="PNG",
                        help="no runs: draw the curves of the --combine reports (one per framework) into PNG")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.figure is None and args.out is None:
        parser.error("--out is required (unless --figure)")
    if args.figure is not None and args.combine is None:
        parser.error("--figure needs the reports to draw: --combine JSON [JSON ...]")
    if args.combine is None and (args.official_root is None or args.framework is None):
        parser.error("--official-root and --framework are required (unless --combine)")
    try:
        args.regime = regime(args.settings, args.split)
    except ValueError as error:
        parser.error(str(error))
    return args


def regime(settings: list[str], split: str = "val") -> dict[str, Any]:
    """The overrides of ``--set KEY=VALUE`` (VALUE as YAML) and ``--split``: what both sides' runs change from the
    mini study's settings. ValueError naming a malformed or repeated setting."""
    overrides: dict[str, Any] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip() or key.strip() != key:
            raise ValueError(f"--set: expected KEY=VALUE (e.g. schedule.crop_size=96), got {setting!r}")
        if key in overrides:
            raise ValueError(f"--set: {key} given twice")
        overrides[key] = yaml.safe_load(value)
    if split != "val":
        overrides["evaluation.split"] = split
    return overrides


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.figure is not None:
        reports = [json.loads(p.read_text()) for p in args.combine]
        plot_curves(reports, args.figure)
        rows = records(reports)
        args.figure.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"records": rows}
    if args.combine is None:
        try:  # every run's length checked before anything starts
            for framework in frameworks_run(args):
                official_epochs(framework, project_config(framework, args.data_seed, args.seeds[0], args.steps,
                                                          args.regime))
        except ValueError as error:
            sys.exit(f"official_runs.py: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = combine(args.combine) if args.combine is not None else run_all(args)
    (args.out / "official_runs.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("framework", "data_seed", "equivalence")}))
    return report


def frameworks_run(args: argparse.Namespace) -> list[str]:
    """The frameworks a run of ``args`` trains: ``--framework``, then its supervised reference (:data:`SUPERVISED`)
    unless left out."""
    reference = SUPERVISED.get(args.framework, "supervised")
    return [args.framework] + ([] if args.no_supervised or args.framework == reference else [reference])


def patches_of(frameworks: list[str]) -> list[tuple[str, str, str]]:
    """The patches of the official runs of ``frameworks`` (:data:`PATCHES_OF`), each once, in order."""
    return list(dict.fromkeys(patch for framework in frameworks for patch in PATCHES_OF[framework]))


def official_run(folder: Path, framework: str, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """``framework``'s official script on the export ``lists`` (its layout, :data:`LAYOUT`) with ``config``'s settings
    and initial network, epochs of ``N_u / B`` iterations (:func:`official_unimatch_run`, :data:`RUNS`,
    :func:`official_v2_run`, :func:`run_official_psmt`)."""
    if framework in V2:
        return official_v2_run(folder, framework, config, lists, save_path)
    if framework == "psmt":
        return run_official_psmt(folder, config, lists["val"].parents[5], save_path)
    if framework in RUNS:
        return RUNS[framework](folder, config, lists, save_path)
    return official_unimatch_run(folder, framework, config, lists, save_path)


def one_framework(folder: Path, framework: str, data_seed: int, seed: int, lists: dict[str, Path],
                  work: Path, steps: int | None = None, sides: tuple[str, ...] = SIDES,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``sides`` (official, project) of ``framework`` at ``seed`` (``steps``: the iterations, default the mini
    study's; ``overrides``: :func:`project_config`'s), each timed; a side not run has None. ``lists``: the export in
    the framework's layout (:data:`LAYOUT`)."""
    config = project_config(framework, data_seed, seed, steps, overrides)
    results: dict[str, dict[str, Any] | None] = dict.fromkeys(SIDES)
    if "official" in sides:
        started = time.perf_counter()
        results["official"] = official_run(folder, framework, config, lists, work / f"{framework}_{seed}")
        results["official"]["seconds"] = time.perf_counter() - started
    if "project" in sides:
        results["project"] = project_run(config)
    row: dict[str, Any] = {"seed": seed}
    for side, result in results.items():
        row.update({f"{side}_miou": result and result["best"], f"{side}_last_miou": result and result["last"],
                    f"{side}_curve": result and result["curve"],
                    f"{side}_seconds": result and round(result["seconds"], 1)})
        if result and "student_curve" in result:  # UniMatch V2's loops evaluate the model beside its EMA
            row.update({f"{side}_student_curve": result["student_curve"],
                        f"{side}_student_miou": max(result["student_curve"])})
    print(f"{framework} seed {seed}: " + ", ".join(
        f"{side} {r['best']:.2f} (last {r['last']:.2f}, {r['seconds']:.0f} s)" for side, r in results.items() if r),
        flush=True)
    return row


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every run of ``args`` (the framework's seeds, then the supervised reference's), the report rewritten after
    each so that a stopped job keeps what it finished."""
    frameworks = frameworks_run(args)
    folders = {fw: checkout(args.official_root, OFFICIAL[fw][0]) for fw in frameworks}
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    work = args.out / "work"
    data = study_of(project_config(args.framework, args.data_seed, args.seeds[0], args.steps, args.regime))
    exports = {layout: export_official_layout(data, work / ("data" if layout == "unimatch" else f"data_{layout}"),
                                              layout=layout, split=args.split)
               for layout in dict.fromkeys(LAYOUT[fw] for fw in frameworks)}
    results: dict[str, list[dict]] = {fw: [] for fw in frameworks}
    print("patches of the official runs:\n" + "\n".join(f"  {p[0]} -> {p[1]} ({p[2]})" for p in patches_of(frameworks)),
          flush=True)
    for fw in frameworks:
        for seed in args.seeds:
            results[fw].append(one_framework(folders[fw], fw, args.data_seed, seed, exports[LAYOUT[fw]], work,
                                             args.steps, (args.side,) if args.side else SIDES, args.regime))
            report = report_of(args, folders[args.framework], results, time.perf_counter() - started)
            (args.out / "official_runs.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def report_of(args: argparse.Namespace, folder: Path, results: dict[str, list[dict]], seconds: float) -> dict[str, Any]:
    supervised = results.get(SUPERVISED.get(args.framework, "supervised"), [])
    report = {"framework": args.framework, "data_seed": args.data_seed, "regime": args.regime,
              "runs": results.get(args.framework, []), "supervised": supervised,
              "official": {"repository": OFFICIAL[args.framework][0], "script": OFFICIAL[args.framework][1],
                           "folder": str(folder)},
              "patches": [dict(zip(("replaced", "by", "why"), p)) for p in patches_of(frameworks_run(args))],
              **provenance("official_runs.py", args.argv), "seconds": round(seconds, 1)}
    return with_verdict(report)

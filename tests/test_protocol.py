"""The protocol mechanism: one table of switches, ``protocol`` sets them all, an explicit switch wins,
the doc is the table, and the MLflow params / tags carry them."""

from __future__ import annotations

import ast
import json
from functools import cache
from pathlib import Path

import pytest

from npsemiseg.config import cell_config, compose, config_params, switches, with_overrides
from npsemiseg.frameworks import framework_names
from npsemiseg.protocol import (
    NOT_APPLICABLE,
    PROTOCOLS,
    STEP_GOLDENS,
    SWITCHES,
    TEST_ID,
    Derived,
    get_switch,
    implemented_switches,
    protocol_markdown,
)
from npsemiseg.training import train
from semiseg_platform.tracking import mlflow_names
from semiseg_platform.tracking.tags import cell_tags

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "PROTOCOL.md"


def _cell_for(switch) -> dict[str, str]:
    """A smoke cell the switch applies to."""
    framework = switch.frameworks[0] if switch.frameworks else "u2pl"
    head = switch.heads[0] if switch.heads else "baseline"
    candidates = ("synthetic_blender" if switch.needs_lists else "synthetic", "synthetic_cityscapes")
    dataset = next(d for d in candidates if switch.applies(framework=framework, dataset=d, head=head))
    return {"framework": framework, "head": head, "dataset": dataset}


def test_doc_is_generated_from_the_table():
    assert DOC.read_text() == protocol_markdown(), "docs/PROTOCOL.md is stale: python -m npsemiseg.protocol > docs/PROTOCOL.md"
    for name in SWITCHES:
        assert f"`{name}`" in DOC.read_text()


def test_every_switch_has_distinct_values_and_a_source():
    for switch in SWITCHES.values():
        assert switch.released != switch.corrected, switch.name
        assert switch.source and switch.changes and switch.rows, switch.name
    assert len(implemented_switches()) >= 14
    assert all(switch.target is not None for switch in SWITCHES.values())  # every known difference is a switch


@cache
def _test_functions(path: str) -> frozenset[str]:
    """The module-level test functions of the test file ``path`` (relative to the repository root)."""
    tree = ast.parse((ROOT / path).read_text())
    return frozenset(node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))


@pytest.mark.parametrize("switch", SWITCHES.values(), ids=lambda s: s.name)
def test_every_switch_names_its_golden_or_why_there_is_none(switch):
    """Exactly one of ``golden`` (a golden test, first, with the max |difference| it records) and ``no_golden`` (the
    reason); every test either names exists as a test function of its file."""
    assert bool(switch.golden) != bool(switch.no_golden), f"{switch.name}: set golden or no_golden, not both"
    text = switch.golden or switch.no_golden
    named = TEST_ID.findall(text)
    if switch.golden:
        assert TEST_ID.match(switch.golden) and named[0].split("::")[0].endswith("_golden.py"), switch.golden
        assert ": " in switch.golden.removeprefix(named[0]), f"{switch.name}: the golden's max |difference| is missing"
    for test_id in named:
        path, _, function = test_id.partition("::")
        assert (ROOT / path).is_file(), f"{switch.name}: no file {path}"
        assert function in _test_functions(path), f"{switch.name}: no test function {test_id}"


@pytest.mark.parametrize("golden", STEP_GOLDENS, ids=lambda g: g[0])
def test_every_step_golden_names_an_existing_test_of_a_registered_framework(golden):
    name, _, test_id, _ = golden
    assert name in framework_names(), name
    path, _, function = test_id.partition("::")
    assert path.endswith("_golden.py") and function in _test_functions(path), test_id


@pytest.mark.parametrize("switch", implemented_switches(), ids=lambda s: s.name)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_protocol_sets_every_switch_on_the_paper_preset(switch, protocol):
    composition = compose("paper", protocol=protocol, partition="1/16", **_cell_for(switch))
    config = composition.config
    expected = getattr(switch, protocol)
    if isinstance(expected, Derived):
        expected = expected.compute(config.model_dump(mode="json"))
    if expected is None and switch.target == "evaluation.stride":  # left to the derived stride
        assert composition.provenance[switch.target][-1].step == "derived"
        expected = config.evaluation.stride
    assert config.protocol == protocol
    assert switches(config)[switch.name] == expected
    assert config_params(config)[f"switches.{switch.name}"] == (expected if isinstance(expected, str) else json.dumps(expected))


@pytest.mark.parametrize("switch", implemented_switches(), ids=lambda s: s.name)
def test_an_explicit_switch_wins_over_the_protocol(switch):
    cell = _cell_for(switch)
    value = switch.corrected
    if isinstance(value, Derived):
        value = "center_crop" if switch.target == "evaluation.mode" else 8
    by_name = cell_config("smoke", protocol="released", **cell, **{f"switches.{switch.name}": value})
    assert switches(by_name)[switch.name] == value
    assert by_name.protocol == "released"
    released = cell_config("smoke", protocol="released", **cell)
    assert with_overrides(released, {f"switches.{switch.name}": value}) == by_name
    # every other switch keeps its released value (a switch that chooses the framework class leaves out those that
    # concern only one of its two classes: mt_cps's own switches do not apply to framework mt)
    def concerns_both(other) -> bool:
        classes = (switch.released, switch.corrected)
        return switch.target != "framework" or other.frameworks is None or set(classes) <= set(other.frameworks)

    kept = {s.name for s in implemented_switches() if s.name != switch.name and concerns_both(s)}
    assert {k: v for k, v in switches(by_name).items() if k in kept} == {
        k: v for k, v in switches(released).items() if k in kept}


def test_changing_the_protocol_rewrites_the_switches():
    released = cell_config("paper", framework="u2pl", head="np", protocol="released")
    corrected = cell_config("paper", framework="u2pl", head="np", protocol="corrected")
    assert with_overrides(released, {"protocol": "corrected"}) == corrected
    assert with_overrides(corrected, protocol="released") == released
    assert released.cell_id != corrected.cell_id
    assert released.head.options["attention"] == "per_channel" and corrected.head.options["attention"] == "euclidean"
    # a new framework under the same protocol gets that framework's switches
    psmt = with_overrides(released, framework="psmt")
    assert psmt.framework_options["tvat_released_normalization"] is True and psmt.framework_options["warmup_epochs"] == 5


def test_switches_that_do_not_apply_are_not_applicable():
    config = cell_config("smoke", framework="supervised", head="baseline", protocol="released")
    values = switches(config)
    assert values["np_attention"] == NOT_APPLICABLE and values["u2pl_teacher_train_mode"] == NOT_APPLICABLE
    assert values["evaluation_select"] == "best"
    # an unimplemented row is never applicable: it sets nothing
    assert values["mt_framework"] == NOT_APPLICABLE and values["psmt_epochs"] == NOT_APPLICABLE


def test_unknown_and_unimplemented_switches_are_refused(monkeypatch):
    import npsemiseg.protocol as protocol

    with pytest.raises(ValueError, match="switch: unknown name 'nope'"):
        cell_config("smoke", **{"switches.nope": 1})
    # every known difference is implemented: a switch without a key is refused by name
    todo = protocol.Switch("todo", "loop", None, 1, 2, "nowhere", "nothing yet", "[D0](deviations.md)")
    monkeypatch.setitem(protocol.SWITCHES, "todo", todo)
    with pytest.raises(ValueError, match="not implemented yet"):
        cell_config("smoke", **{"switches.todo": 1})
    with pytest.raises(ValueError, match="protocol"):
        cell_config("smoke", protocol="bugged")
    assert get_switch("np_kl").owner == "head"


def test_mlflow_params_and_tags_carry_protocol_and_switches():
    config = cell_config("smoke", framework="u2pl", head="np", protocol="released")
    params = config_params(config)
    assert params["protocol"] == "released"
    assert {f"switches.{name}" for name in SWITCHES} <= set(params)
    assert params["switches.np_attention"] == "per_channel"
    assert params["switches.psmt_warmup_epochs"] == NOT_APPLICABLE
    assert cell_tags(config)[mlflow_names.PROTOCOL] == "released"
    # the same key set for every cell
    other = config_params(cell_config("smoke", framework="psmt", head="baseline"))
    assert set(other) == set(params)
    # one cell under both protocols: two runs with two names, the same coordinates
    corrected = with_overrides(config, protocol="corrected")
    assert (config.run_name, corrected.run_name) == ("u2pl/synthetic/1/16/np/released", "u2pl/synthetic/1/16/np/corrected")
    assert config.cell_name == corrected.cell_name and config.cell_id != corrected.cell_id


@pytest.mark.parametrize("head", ["baseline", "np"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("framework", framework_names())
def test_smoke_cell_of_every_framework_under_each_protocol(smoke_config, framework, head, protocol):
    """Every framework trains and evaluates a smoke cell under both protocols, logging both selections."""
    config = smoke_config(framework=framework, head=head, protocol=protocol,
                          **{"schedule.eval_every_epochs": 1, "schedule.epoch_length": "labeled",
                             "data.options.train_size": 32})
    result = train(config)
    assert result.steps == 3 and 0.0 <= result.metrics["miou"] <= 1.0
    assert {"last/miou", "best/miou", "best/step"} <= set(result.metrics)
    assert result.metrics["miou"] == result.metrics["best/miou" if protocol == "released" else "last/miou"]

"""``runtime.compile``: the networks under ``torch.compile`` (inductor) give the eager step's losses and gradients.

Each comparison builds the same smoke cell twice from the same seed, once eager and once with ``runtime.compile``,
and runs the loop's ``train_step`` (LR, the framework's step, backward, gradient norm, SGD, EMA) on the same batch
from the same RNG state. Losses and every logged value agree at ``rtol=1e-5, atol=1e-6`` (the logged gradient norm
at the gradients' ``5e-5``); the student's gradients as a whole within ``5e-5`` of their norm, and each tensor
elementwise within ``1e-5 |g| + 2e-4 max|g|`` (plus ``1e-6`` of the largest gradient: a conv bias before a norm
has a zero gradient up to round-off; :func:`assert_steps_match`).

Why these: compiled kernels fuse and reorder float32 sums (BatchNorm statistics and their backward over the smoke
cell's 2 x 8 x 8 pixels, convolution weight gradients), and BatchNorm's backward on such tiny batches amplifies the
last bits. Measured (1 thread): the compiled supervised step's gradients differ from eager's by 1.7e-6 (baseline
head) / 7.6e-6 (NP head) of their norm and per tensor by at most 5.7e-5 / 1.9e-5 of the tensor's largest element;
eager with oneDNN off (another convolution algorithm, the same arithmetic reordered) differs from eager by 1.9e-6 /
6.3e-6 and 1.8e-5: the same round-off. Losses agree to ~2e-7. Dropout masks and NP samples agree exactly:
inductor's ``fallback_random`` draws them with eager's kernels on the same generator.

The tests run with one intra-op thread (``conftest.py``). With two threads, eager oneDNN convolution backward on
this CPU differs from a float64 step by ~1.5e-3 of the gradient's norm (the compiled step, and eager with oneDNN off,
by ~2e-6), so a comparison there measures oneDNN, not compile.

Negative case (:func:`test_a_changed_operation_in_the_compiled_network_fails_the_comparison`): the compiled
classifier block's first ReLU made a LeakyReLU with slope 1e-3, an arithmetic change far smaller than any bug would
make, and the same comparison fails.

Inductor on CPU compiles C++: without a C++ compiler the compiled tests skip, naming what is missing. CPU compilation
takes seconds per graph, so the matrix is ``integration`` (``make test``) and its cells share dynamo's graphs (the
same smoke networks in every framework; a new shape or mode recompiles).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch._dynamo.utils import counters

from test_frameworks import _batch as smoke_batch
from npsemiseg.config import RunConfig
from npsemiseg.frameworks import framework_names
from npsemiseg.frameworks.base import StepContext
from npsemiseg.heads import head_names
from npsemiseg.models import check_compile_device, compile_segmentor
from npsemiseg.models.compile import compile_options, compiled_networks, is_compiled
from npsemiseg.training.factories import build_model, build_optimizer
from npsemiseg.training.setup import _framework_on_device
from npsemiseg.training.step import _to_device, train_step

HAVE_COMPILER = any(shutil.which(c) for c in ("g++", "c++", "clang++"))
needs_compiler = pytest.mark.skipif(not HAVE_COMPILER, reason="torch.compile on CPU (inductor) needs a C++ compiler "
                                                                "(g++, c++ or clang++ on PATH); none found")
#: logged values (losses, norms): relative / absolute
RTOL, ATOL = 1e-5, 1e-6
#: gradients: the difference's norm over all student gradients relative to theirs, and elementwise
#: ``|compiled - eager| <= RTOL |eager| + GRAD_ATOL max|eager| + ZERO_ATOL max|all gradients|`` per tensor (module
#: docstring: why; the last term for gradients that are zero in exact arithmetic: a conv bias before a norm)
GRAD_NORM_RTOL, GRAD_ATOL, ZERO_ATOL = 5e-5, 2e-4, 1e-6
#: small U2PL queues / queries for CPU tests (as tests/test_frameworks.py)
U2PL_SMALL = {"sup_only_epochs": 0, "num_queries": 8, "num_negatives": 4, "queue_size": 32, "background_queue_size": 48}


@dataclass
class Stepped:
    """One ``train_step``'s logs, the student's gradients after it and every module's ``state_dict``."""

    logs: dict[str, float]
    grads: dict[str, torch.Tensor]
    states: dict[str, dict[str, torch.Tensor]]


def _config(smoke_config, framework: str, head: str, compile_mode: str = "off") -> RunConfig:
    options = dict(U2PL_SMALL) if framework == "u2pl" else {}
    return smoke_config(framework=framework, head=head, framework_options=options,
                        **{"runtime.compile": compile_mode, "runtime.device": "cpu"})


def _step(config: RunConfig, prepare=None) -> Stepped:
    """Build the framework (seed 0; on the CPU as ``setup_run`` does: ``runtime.channels_last``), optionally
    ``prepare`` it, take one ``train_step`` from seed 1; a compiled step must have compiled graphs."""
    framework = _framework_on_device(config, torch.device("cpu"), 1)
    if prepare is not None:
        prepare(framework)
    optimizer = build_optimizer(config, framework.student)
    ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
    torch.manual_seed(1)
    logs = train_step(framework, smoke_batch(config), ctx, optimizer, config, torch.device("cpu"), 1)
    if config.runtime.compile != "off":
        assert counters["stats"]["unique_graphs"] >= len(compiled_networks(framework.student))
    grads = {n: p.grad.clone() for n, p in framework.student.named_parameters() if p.grad is not None}
    states = {name: module.state_dict() for name, module in framework.modules().items()}
    return Stepped(logs, grads, states)


def assert_steps_match(eager: Stepped, compiled: Stepped) -> None:
    """Logs and gradients equal at ``RTOL`` / ``ATOL``; ``state_dict`` keys identical (no ``_orig_mod.``)."""
    assert compiled.logs.keys() == eager.logs.keys()
    for key, value in eager.logs.items():
        rel = GRAD_NORM_RTOL if key == "train/grad_norm" else RTOL  # a gradient's norm: the gradients' tolerance
        assert compiled.logs[key] == pytest.approx(value, rel=rel, abs=ATOL), key
    assert compiled.grads.keys() == eager.grads.keys()
    difference = torch.stack([(compiled.grads[n] - g).norm() for n, g in eager.grads.items()]).norm()
    norm = torch.stack([g.norm() for g in eager.grads.values()]).norm()
    assert difference <= GRAD_NORM_RTOL * norm, f"gradients differ by {float(difference / norm):.2e} of their norm"
    largest = max(float(g.abs().max()) for g in eager.grads.values())
    for name, grad in eager.grads.items():
        atol = GRAD_ATOL * float(grad.abs().max()) + ZERO_ATOL * largest
        torch.testing.assert_close(compiled.grads[name], grad, rtol=RTOL, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
    for module, state in eager.states.items():
        assert list(compiled.states[module]) == list(state), module


# ------------------------------------------------------------------------------------------------- unit
def test_compile_option_values_and_devices(smoke_config):
    """``runtime.compile`` takes the four modes (default off, not part of cell_id), rejects others naming the
    allowed ones; ``reduce-overhead`` is refused on CPU; the options ask for eager's random draws."""
    config = smoke_config()
    assert config.runtime.compile == "off" and config.runtime.channels_last is False
    for mode in ("default", "reduce-overhead", "max-autotune"):
        assert _config(smoke_config, "supervised", "baseline", mode).cell_id == config.cell_id
        assert compile_options(mode)["fallback_random"] is True
    with pytest.raises(ValidationError, match="compile"):
        smoke_config(**{"runtime.compile": "fast"})
    with pytest.raises(ValueError, match="reduce-overhead.*CUDA device.*'cpu'"):
        check_compile_device("reduce-overhead", torch.device("cpu"))
    with pytest.raises(ValueError, match="reduce-overhead"):  # where a run sets up its framework
        _framework_on_device(_config(smoke_config, "supervised", "baseline", "reduce-overhead"), torch.device("cpu"), 1)
    check_compile_device("default", torch.device("cpu"))
    assert compile_options("max-autotune")["max_autotune"] is True


@pytest.mark.parametrize("head", head_names())
def test_build_model_compiles_the_networks_in_place(smoke_config, head):
    """Encoder, decoder and the head's networks are compiled in place (lazily: nothing compiles before a call);
    the head's own forward (memories, checks) is not; the state_dict keys are eager's."""
    eager = build_model(_config(smoke_config, "u2pl", head))
    compiled = build_model(_config(smoke_config, "u2pl", head, "default"))
    networks = compiled_networks(compiled)
    assert compiled.backbone in networks and compiled.decoder in networks and compiled.representation_head in networks
    assert all(is_compiled(m) for m in networks) and not is_compiled(compiled.head) and not is_compiled(compiled)
    assert not any(is_compiled(m) for m in eager.modules())
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert compile_segmentor(eager, "off") is eager and not is_compiled(eager.backbone)


def test_channels_last_step_equals_the_contiguous_step(smoke_config):
    """``runtime.channels_last``: weights and images in channels-last memory format, the same step (eager, CPU)."""
    config = _config(smoke_config, "mt", "np")
    last = config.model_copy(update={"runtime": config.runtime.model_copy(update={"channels_last": True})})
    conv = _framework_on_device(last, torch.device("cpu"), 1).student.backbone.conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = _to_device(smoke_batch(config).labeled, torch.device("cpu"), channels_last=True)
    assert images["image"].is_contiguous(memory_format=torch.channels_last) and images["label"].is_contiguous()
    assert_steps_match(_step(config), _step(last))


# ------------------------------------------------------------------------------------------------- compiled
@pytest.fixture(scope="module", autouse=True)
def _shared_graphs():
    """The cells share dynamo's compiled graphs (the same smoke networks; a new shape recompiles): past the recompile
    limit dynamo would run eager silently and the comparison would prove nothing, so reaching it fails instead."""
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


#: ``make test`` compiles one cell: ``supervised`` x NP, the most compiled networks (encoder, decoder, the NP head's
#: query ConvNet, latent encoder and decoder) and random draws (the NP samples) of one step; CPU compilation takes
#: minutes per cell on a 2-core machine (``docs/performance.md``, compiled steps), so the rest is asked for:
#: ``COMPILE_TEST_CELLS=all`` adds every other head with ``supervised`` and the NP head on every framework, among them
#: U2PL (aux and representation heads, the NP context pass) and UniMatch (the joint feature-perturbed decode,
#: eval-mode teacher passes). PS-MT is left out: its T-VAT perturbation follows a normalised gradient, which amplifies
#: float32 reordering itself: eager with oneDNN off (another convolution algorithm) differs from eager by 3e-3 in PS-MT
#: x NP's loss and 7 % in its gradient norm (8e-4 / 6 % with the baseline head), and compiled by as much.
CELLS = [("supervised", "np")]
if os.environ.get("COMPILE_TEST_CELLS") == "all":
    CELLS += [("supervised", h) for h in head_names() if h != "np"]
    CELLS += [(f, "np") for f in framework_names() if f not in ("supervised", "psmt")]


@needs_compiler
@pytest.mark.integration
@pytest.mark.parametrize(("framework", "head"), CELLS)
def test_compiled_step_equals_eager(smoke_config, framework, head):
    eager = _step(_config(smoke_config, framework, head))
    compiled = _step(_config(smoke_config, framework, head, "default"))
    assert_steps_match(eager, compiled)


def _leaky_first_relu(framework) -> None:
    for model in framework.modules().values():
        block = model.head.classifier
        block[2] = nn.LeakyReLU(1e-3)


@needs_compiler
@pytest.mark.integration
def test_a_changed_operation_in_the_compiled_network_fails_the_comparison(smoke_config):
    eager = _step(_config(smoke_config, "supervised", "baseline"))
    changed = _step(_config(smoke_config, "supervised", "baseline", "default"), prepare=_leaky_first_relu)
    with pytest.raises(AssertionError):
        assert_steps_match(eager, changed)

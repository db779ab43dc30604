"""Shared pytest fixtures and the ``numerics`` marker (keep this file small: each part's helpers live in its own test
modules)."""

from __future__ import annotations

import os

import pytest
import torch

#: intra-op threads of each test process: 1 (tests share two CPU cores with other work), or what
#: ``NPSEMISEG_TEST_THREADS`` says (``make test-portable`` runs the ``numerics`` tests with 2)
TEST_THREADS = int(os.environ.get("NPSEMISEG_TEST_THREADS", "1"))

#: Tests besides the goldens whose outcome rests on the CPU's floating-point kernels (which ATen / oneDNN / MKL
#: kernels run, how many threads split a reduction), marked ``numerics`` with them: a difference that is 0 in exact
#: arithmetic compared with its sign, or two computations of one quantity (fused and plain, whole image and windows,
#: lean and full) compared at float32 tolerances. A node id, or its prefix ``path::test`` for every parameter.
NUMERICS_TESTS = (
    # the supervised-only step's KL of a context equal to its targets: 0 up to round-off, of either sign
    "tests/test_frameworks.py::test_u2pl_np_kl_during_the_supervised_only_epochs",
    # one quantity two ways at float32 tolerances: whole image and windows, lean and materialised, fused and plain
    "tests/test_evaluation_inference.py::test_sliding_with_window_covering_the_image_equals_whole",
    "tests/test_evaluation_inference.py::test_sliding_global_with_full_scale_single_window_equals_whole",
    "tests/test_evaluation_inference.py::test_center_crop_pads_a_small_image_with_the_mean_and_crops_back",
    "tests/test_training.py::test_upsampling_ce_equals_the_materialised_form_with_gradients",
    "tests/test_training.py::test_mean_softmax_equals_the_materialised_form_with_gradients",
    "tests/test_models.py::test_decoder_passes_batched_or_looped_compute_the_same_function",
    "tests/test_models.py::test_atrous_conv_skips_padding_taps_with_the_same_output_and_gradients",
    "tests/test_frameworks_unimatch.py::test_feature_perturbation_decodes_clean_and_perturbed_as_one_batch",
    "tests/test_heads_np.py::test_attention_matches_direct_computation_with_masking",
    "tests/test_heads_np.py::test_split_decoder_equals_concat_including_border",
    "tests/test_heads_np.py::test_fused_decoder_tail_equals_plain_layers_with_gradients",
    "tests/test_heads_np.py::test_inference_decoder_matches_the_plain_layers_at_every_map_size_and_offset",
    "tests/test_heads.py::test_gaussian_kl_matches_torch_distributions",
)


def _reads_recorded_numbers(item: pytest.Item) -> bool:
    """A golden: a module named ``test_*golden*.py``, or one that reads ``tests/golden/`` through ``golden_files`` or
    ``step_golden`` (a golden is covered whatever its name)."""
    if "golden" in item.path.name:
        return True
    helpers = {"golden_files", "step_golden"}
    module = getattr(item, "module", None)
    return module is not None and any(getattr(value, "__name__", None) in helpers
                                      or getattr(value, "__module__", None) in helpers for value in vars(module).values())


def _listed_as(node_id: str, entry: str) -> bool:
    """``entry`` is the node id itself, its test without the parameters, or its module."""
    return node_id == entry or node_id.startswith((f"{entry}[", f"{entry}::"))


def _listed(node_id: str) -> bool:
    return any(_listed_as(node_id, entry) for entry in NUMERICS_TESTS)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` and ``-k`` deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the goldens and :data:`NUMERICS_TESTS` ``numerics`` (``make test-portable`` runs them under other kernel
    paths of the CPU). When the whole suite is collected, an entry of the list that names no test is an error (a
    renamed test would otherwise drop out of the target unseen)."""
    for item in items:
        if _reads_recorded_numbers(item) or _listed(item.nodeid):
            item.add_marker(pytest.mark.numerics)
    if config.args_source is pytest.Config.ArgsSource.TESTPATHS:
        stale = [entry for entry in NUMERICS_TESTS if not any(_listed_as(item.nodeid, entry) for item in items)]
        if stale:
            raise pytest.UsageError(f"tests/conftest.py NUMERICS_TESTS: {', '.join(stale)} names no collected test")


@pytest.fixture(autouse=True, scope="session")
def _test_threads_per_process():
    """:data:`TEST_THREADS` intra-op threads (1 unless asked): predictable on two shared cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def single_seeded_thread():
    """Seed 0 and :data:`TEST_THREADS` intra-op threads (one unless ``make test-portable`` asks for more) for each
    test of a module that asks (``pytestmark = pytest.mark.usefixtures("single_seeded_thread")``): exact, repeatable
    draws; the goldens' tolerances must hold for other thread counts too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def smoke_config():
    """``smoke_config(framework="supervised", head="baseline", dataset="synthetic", **overrides)``:
    the ``smoke`` preset of one cell (a few CPU seconds of training)."""
    from npsemiseg.config import cell_config

    def make(framework: str = "supervised", head: str = "baseline", dataset: str = "synthetic",
             partition: str = "1/16", **overrides):
        return cell_config("smoke", framework=framework, dataset=dataset, partition=partition,
                                     head=head, **overrides)

    return make

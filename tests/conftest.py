"""Shared pytest fixtures (keep this file small: each part's helpers live in its own test modules)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_test_process():
    """Tests share two CPU cores with other work: one intra-op thread keeps them predictable."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def single_seeded_thread():
    """One intra-op thread and seed 0 for each test of a module that asks
    (``pytestmark = pytest.mark.usefixtures("single_seeded_thread")``): exact, repeatable draws."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
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

"""The released NP-SemiSeg model's own context pass (``Segmentor.forward_with_context``) and AugSeg's memory exchange
(``NPHead.swap_memories``), checked on their own; the whole steps are in ``tests/test_np_u2pl_step_golden.py`` and
``tests/test_np_augseg_step_golden.py``."""

from __future__ import annotations

import pytest
import torch
from head_fixtures import batch, small_np

from npsemiseg.config import cell_config
from npsemiseg.training import build_model

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def test_swap_exchanges_target_and_context_and_twice_is_the_identity():
    head = small_np(memory_zero_row=True).train()
    features, labels = batch(b=3)
    head(features, labels=labels, context_features=features[:1], context_labels=labels[:1])
    before = {k: v.clone() for k, v in head.state_dict().items()}
    head.swap_memories()
    for kind in ("memory", "pointer", "count", "centers"):
        assert torch.equal(getattr(head, f"target_{kind}"), before[f"context_{kind}"])
        assert torch.equal(getattr(head, f"context_{kind}"), before[f"target_{kind}"])
    assert not torch.equal(head.target_centers, before["target_centers"])  # the two memories held different rows
    head.swap_memories()
    assert all(torch.equal(v, before[k]) for k, v in head.state_dict().items())


def _np_segmentor(head: str = "np", **overrides):
    config = cell_config("smoke", framework="u2pl", dataset="synthetic", partition="1/16", head=head, **overrides)
    return build_model(config).train()


def test_the_context_pass_has_its_own_batch_statistics_and_the_slice_does_not():
    """With the context's own pass the BN running statistics move twice, and the context centers are not those of
    the labeled slice of the one pass."""
    images, labels = torch.rand(3, 3, 32, 32), torch.randint(0, 8, (3, 32, 32))
    one, own = _np_segmentor(), _np_segmentor()
    own.load_state_dict(one.state_dict())
    one(images, labels=labels, num_context=2)
    own.forward_with_context(images, images[:2], labels=labels, context_labels=labels[:2])
    assert int(own.backbone.bn1.num_batches_tracked) == int(one.backbone.bn1.num_batches_tracked) + 1
    assert not torch.allclose(own.head.context_centers, one.head.context_centers)


def test_the_context_pass_needs_a_head_on_one_decoder_pass():
    model = _np_segmentor("mc_dropout", **{"model.mc_dropout_scope": "decoder"})
    images = torch.rand(2, 3, 32, 32)
    labels = torch.zeros(2, 32, 32, dtype=torch.long)
    with pytest.raises(ValueError, match="forward_with_context: a context pass of its own needs a head on one decoder"):
        model.forward_with_context(images, images[:1], labels=labels, context_labels=labels[:1])

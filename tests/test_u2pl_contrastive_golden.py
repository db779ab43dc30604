"""U2PL's contrastive loss under the released options reproduces what U2PL's released code computed on the same
inputs with ignored (255) pixels (``tests/golden/u2pl_contrastive_released.npz``, recorded by
``tests/golden/record_u2pl_contrastive_golden.py``; source and command in ``u2pl_contrastive_released.json``).

Same embeddings, probabilities, labels, masks and injected ``randint`` draws; two steps share the queues.
Tolerance: float32 round-off, ``|ours - theirs| <= 1e-5 * max(1, |theirs|)`` for the loss, exact equality for
class membership, enqueued counts and queued keys (copies of the same float32 values).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from golden_files import recorded, sidecar
from npsemiseg.config import compose
from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.frameworks.contrastive import U2PL_BUGS, ClassQueues, class_membership, contrastive_loss
from npsemiseg.heads.base import downsample_labels

SIDECAR = sidecar("u2pl_contrastive_released")
DATA = recorded("u2pl_contrastive_released")
SIZES = SIDECAR["sizes"]
RTOL_SCALE = 1e-5
#: the recorder's queue sizes (class 0, the others)
SIZES_BANK = (50000, 30000)
#: the released options (switches u2pl_label_onehot, u2pl_label_onehot_ignored, u2pl_labeled_negatives,
#: u2pl_prototype_index)
RELEASED = {f"{bug}_bug": True for bug in U2PL_BUGS}

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def test_the_released_protocol_sets_these_options():
    """What the golden checks is what ``protocol: released`` runs; ``corrected`` turns every bug off."""
    cell = dict(framework="u2pl", dataset="pascal_classic", partition="92", head="baseline")
    released = compose("paper", **cell, protocol="released").config.framework_options
    assert {k: released[k] for k in RELEASED} == RELEASED
    corrected = compose("paper", **cell, protocol="corrected").config.framework_options
    assert not any(corrected[k] for k in RELEASED)


class _Draws:
    """``torch.randint`` that returns the recorded draws in order, checking each bound and size."""

    def __init__(self, monkeypatch):
        self.queue: list[tuple[int, np.ndarray]] = []
        def replay(high, size, **kwargs):
            assert self.queue, "ours draws more than the released code"
            bound, values = self.queue.pop(0)
            assert (int(high), tuple(size)) == (bound, values.shape), "a draw of another bound or size"
            return torch.from_numpy(values).to(kwargs.get("device") or "cpu")

        monkeypatch.setattr(torch, "randint", replay)

    def load(self, step: int) -> None:
        highs = DATA[f"step{step}/draw_highs"]
        self.queue[:] = [(int(high), DATA[f"step{step}/draw/{i:03d}"]) for i, high in enumerate(highs)]


def _step_inputs(step: int):
    """The loss's inputs as :meth:`U2PL._contrastive` builds them: labels and masks resized (nearest) to the
    feature size, labeled pixels reliable and unreliable where not ignored."""
    labels_l = torch.from_numpy(DATA[f"step{step}/labels_l"])
    pseudo = torch.from_numpy(DATA[f"step{step}/pseudo"])
    size = (SIZES["h"], SIZES["w"])
    valid_l = labels_l != IGNORE_INDEX
    labels = downsample_labels(torch.cat([labels_l, pseudo]), size)
    reliable = downsample_labels(torch.cat([valid_l, torch.from_numpy(DATA[f"step{step}/reliable_u"])]).long(), size)
    unreliable = downsample_labels(torch.cat([valid_l, torch.from_numpy(DATA[f"step{step}/unreliable_u"])]).long(), size)
    return labels, reliable.bool(), unreliable.bool()


def _run(monkeypatch, bugs) -> dict[str, object]:
    draws = _Draws(monkeypatch)
    queues = ClassQueues([SIZES_BANK[0]] + [SIZES_BANK[1]] * (SIZES["K"] - 1), SIZES["E"])
    out: dict[str, object] = {}
    for step in range(1, 3):
        labels, reliable, unreliable = _step_inputs(step)
        draws.load(step)
        before = [queues.class_keys(c).shape[0] for c in range(SIZES["K"])]
        loss, _ = contrastive_loss(
            torch.from_numpy(DATA[f"step{step}/rep_student"]), torch.from_numpy(DATA[f"step{step}/rep_teacher"]),
            torch.from_numpy(DATA[f"step{step}/prob"]), labels, reliable, unreliable, SIZES["BL"], queues,
            anchor_threshold=SIZES["current_class_threshold"], low_rank=SIZES["low_rank"],
            high_rank=SIZES["high_rank"], temperature=SIZES["temperature"], num_queries=SIZES["num_queries"],
            num_negatives=SIZES["num_negatives"], released_bugs=bugs)
        out[f"step{step}/loss"] = float(loss)
        out[f"step{step}/left"] = len(draws.queue)
        out[f"step{step}/new_keys"] = [queues.class_keys(c).shape[0] - before[c] for c in range(SIZES["K"])]
        out[f"step{step}/queues"] = [queues.class_keys(c).numpy().copy() for c in range(SIZES["K"])]
        out[f"step{step}/membership"] = class_membership(
            labels, SIZES["BL"], SIZES["K"], onehot_bug="label_onehot" in bugs,
            ignored_as_background="label_onehot_ignored" in bugs).numpy()
    return out


def test_released_contrastive_loss_reproduces_the_released_code(monkeypatch):
    """Membership (their ``label_onehot`` resized), enqueued keys, queues and the loss of two steps."""
    ours = _run(monkeypatch, tuple(U2PL_BUGS))
    deviations = {}
    for step in (1, 2):
        assert np.array_equal(ours[f"step{step}/membership"], DATA[f"step{step}/membership"]), f"step {step} membership"
        assert ours[f"step{step}/new_keys"] == DATA[f"step{step}/new_keys"].tolist(), f"step {step} enqueued keys"
        for c, keys in enumerate(ours[f"step{step}/queues"]):
            assert np.array_equal(keys, DATA[f"step{step}/queue/{c}"]), f"step {step} queue {c}"
        assert ours[f"step{step}/left"] == 0, f"step {step}: ours drew fewer numbers than the released code"
        theirs = float(DATA[f"step{step}/loss"])
        diff = abs(ours[f"step{step}/loss"] - theirs)
        deviations[step] = diff
        assert diff <= RTOL_SCALE * max(1.0, abs(theirs)), f"step {step} loss: max |difference| {diff:.3g}"
    print(json.dumps({f"step{k}/loss": f"{v:.2e}" for k, v in deviations.items()}))


def test_the_golden_tells_the_ignored_pixels_apart(monkeypatch):
    """Without ``label_onehot_ignored`` (ignored pixels left out of the union, as ``corrected`` would) the first
    images' membership differs from the released code's: the golden catches the switch."""
    labels, _, _ = _step_inputs(1)
    ours = class_membership(labels, SIZES["BL"], SIZES["K"], onehot_bug=True).numpy()
    assert not np.array_equal(ours, DATA["step1/membership"])


def test_corrected_membership_is_each_images_own_classes():
    """``corrected`` (no bug): one class per non-ignored pixel of every image, none where ignored."""
    labels, _, _ = _step_inputs(1)
    member = class_membership(labels, SIZES["BL"], SIZES["K"])
    valid = labels != IGNORE_INDEX
    assert torch.equal(member.sum(dim=1), valid.long())
    assert torch.equal(member.float().argmax(dim=1)[valid], labels[valid])
    # the ignore switch alone (without the one-hot bug) changes nothing
    assert torch.equal(class_membership(labels, SIZES["BL"], SIZES["K"], ignored_as_background=True), member)

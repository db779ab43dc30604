"""Each switch of ``npsemiseg.protocol`` changes behaviour as documented.

Framework and head switches: flipping the one switch from its corrected to its released value (and
nothing else) changes the framework's training steps on the same seeded batch; switches with a stated
effect (train-mode teachers update BN statistics, label padding, precision) are checked for that effect.
``evaluation_select`` is tested with the loop (tests/test_training.py), the NP head's options in
tests/test_heads_np.py and tests/test_heads_ddp.py (``sync_memories`` only differs across ranks).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.protocol import implemented_switches
from npsemiseg.training import build_framework, train_transforms
from npsemiseg.training.step import autocast

#: tiny U2PL queues for CPU tests (as tests/test_frameworks.py)
U2PL_SMALL = {"num_queries": 8, "num_negatives": 4, "queue_size": 64, "background_queue_size": 64}
#: switches whose effect is not a different training step in one CPU process (tested below or elsewhere)
NOT_A_STEP_CHANGE = {
    "np_sync_memories": "only differs across ranks: tests/test_heads_ddp.py",
    "np_eval_samples": "evaluation only",
    "evaluation_select": "tests/test_training.py::test_checkpoint_selection_reports_and_restores_the_best_epoch",
    "fp32": "GPU autocast: test_fp32_switch_turns_autocast_off",
    "u2pl_label_pad": "the data pipeline: test_u2pl_label_pad_switch_pads_labels_with_background",
    "augseg_cps_lists": "partition lists: test_augseg_cps_lists_switch_reads_the_cps_lists",
}
STEP_SWITCHES = [s for s in implemented_switches() if s.name not in NOT_A_STEP_CHANGE]


def _configs(smoke_config, switch, dataset: str = "synthetic"):
    framework = switch.frameworks[0] if switch.frameworks else "u2pl"
    head = switch.heads[0] if switch.heads else "baseline"
    options = U2PL_SMALL if framework == "u2pl" else {}
    corrected = smoke_config(framework=framework, head=head, dataset=dataset, protocol="corrected",
                             framework_options=options)
    released = corrected.with_overrides({f"switches.{switch.name}": switch.released})
    assert released.switches()[switch.name] != corrected.switches()[switch.name]
    return corrected, released


def _batch(config, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    size, k = config.schedule.crop_size, config.num_classes
    labels = torch.randint(0, min(k, 2), (2, size, size), generator=gen)  # classes >= 2 absent: empty memories
    labeled = {"image": torch.rand(2, 3, size, size, generator=gen), "label": labels}
    labeled["image_strong"] = (labeled["image"] * 0.8).clamp(0, 1)
    unlabeled = {"image": torch.rand(2, 3, size, size, generator=gen)}
    unlabeled["image_strong"] = unlabeled["image"].flip(-1)
    return Batch(labeled=labeled, unlabeled=unlabeled)


def _steps(config) -> list[dict[str, float]]:
    """Two training steps (epoch 1, so warm-ups and ramp-ups differ) of a freshly built framework."""
    torch.manual_seed(0)
    framework = build_framework(config)
    optimizer = torch.optim.SGD([p for p in framework.student.parameters() if p.requires_grad], lr=0.05)
    losses = []
    for step in range(2):
        torch.manual_seed(100 + step)
        ctx = StepContext(step=2 + step, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
        result = framework.train_step(_batch(config, step), ctx)
        losses.append({k: float(v.detach()) for k, v in result.losses.items()})
        optimizer.zero_grad()
        result.total.backward()
        optimizer.step()
        framework.after_optimizer_step(ctx)
    return losses


@pytest.mark.parametrize("switch", STEP_SWITCHES, ids=lambda s: s.name)
def test_switch_changes_the_training_step(smoke_config, switch):
    corrected, released = _configs(smoke_config, switch)
    assert _steps(corrected) == _steps(corrected)  # the comparison is deterministic
    assert _steps(released) != _steps(corrected), f"{switch.name}: the released value changes nothing"


@pytest.mark.parametrize("name", ["u2pl_teacher_train_mode", "psmt_teacher_train_mode"])
def test_train_mode_teachers_update_their_bn_statistics(smoke_config, name):
    switch = next(s for s in implemented_switches() if s.name == name)
    for config, moves in zip(_configs(smoke_config, switch), (False, True)):
        torch.manual_seed(0)
        framework = build_framework(config)
        teachers = [m for n, m in framework.modules().items() if n != "student"]
        stats = [{k: v.clone() for k, v in t.state_dict().items() if "running_mean" in k} for t in teachers]
        ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
        framework.train_step(_batch(config, 0), ctx)
        for teacher, before in zip(teachers, stats):
            after = teacher.state_dict()
            changed = any(not torch.equal(v, after[k]) for k, v in before.items())
            assert changed == moves, f"teacher BN statistics changed={changed} with {config.switches()[name]}"


def test_u2pl_label_pad_switch_pads_labels_with_background(smoke_config):
    switch = next(s for s in implemented_switches() if s.name == "u2pl_label_pad")
    corrected, released = _configs(smoke_config, switch)
    for config, pad in ((corrected, 255), (released, 0)):
        config = config.with_overrides({"data.augmentation.scale_range": [0.5, 0.5],
                                        "data.augmentation.resize": "rescale"})
        labeled = train_transforms(config)["labeled"]
        item = {"image": torch.rand(3, 16, 16), "label": torch.ones(16, 16, dtype=torch.long), "id": "x"}
        out = labeled(item)["label"]
        assert (out == pad).any() and set(out.unique().tolist()) <= {1, pad}


def test_augseg_cps_lists_switch_reads_the_cps_lists(smoke_config):
    switch = next(s for s in implemented_switches() if s.name == "augseg_cps_lists")
    corrected, released = _configs(smoke_config, switch, dataset="synthetic_blender")
    assert corrected.list_variant == "u2pl" and released.list_variant == "cps"
    # where the dataset has only one list variant the switch does not apply
    plain = smoke_config(framework="augseg", dataset="synthetic", protocol="released")
    assert plain.list_variant == "u2pl" and plain.switches()[switch.name] == "n/a"


def test_fp32_switch_turns_autocast_off(smoke_config):
    switch = next(s for s in implemented_switches() if s.name == "fp32")
    corrected, released = _configs(smoke_config, switch)
    cuda = torch.device("cuda")
    assert isinstance(autocast(released, cuda), contextlib.nullcontext)
    assert isinstance(autocast(corrected, cuda), torch.autocast)

"""The two protocols of every cell and the switches they set: one table, defined once.

``released`` reproduces the code behind the paper's numbers, bug for bug; ``corrected`` is the paper
done right (today's behaviour where it already is). Each difference between the two is a named
:class:`Switch` of :data:`SWITCHES`: who owns it, its ``released`` and ``corrected`` values, where
the official code has it, what it changes and which configuration field it sets (``target``, a dotted
key of :class:`~npsemiseg.config.RunConfig`: frameworks and heads receive the value through their own
options). ``RunConfig.protocol`` sets every switch that applies to the cell; an explicit override of
one switch (its target key, or ``switches.<name>``) wins, so a single switch can be measured. A switch whose
target is ``framework`` (``mt_framework``) chooses the framework class itself: composition applies it with the
cell's coordinates (:func:`protocol_framework`), before the framework's settings, and an override of it is
given by name (``switches.mt_framework=mt``).

``docs/deviations.md`` describes each difference with its official source (repository, commit, file and
lines); a switch's ``rows`` links to its entry there. A switch whose ``target`` is None is a known difference
that no configuration field selects yet. ``docs/PROTOCOL.md`` is generated from this table
(:func:`protocol_markdown`) and a test keeps them equal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from npsemiseg.constants import NOT_APPLICABLE
from npsemiseg.data import DatasetInfo, dataset_info
from npsemiseg.frameworks import framework_spec
from npsemiseg.heads import head_spec
from npsemiseg.renames import current_key

PROTOCOLS: tuple[str, ...] = ("released", "corrected")
Protocol = Literal["released", "corrected"]
Owner = Literal["framework", "head", "model", "evaluation", "loop", "data"]
#: prefix of a switch given by name in overrides (``switches.np_attention=euclidean``) and of its MLflow param
SWITCH_PREFIX = "switches."
#: a test named in a switch's ``golden`` or ``no_golden`` (``tests/test_x.py::test_y``)
TEST_ID = re.compile(r"tests/[\w/]+\.py::\w+")
#: the target of a switch that chooses the framework class itself (:func:`protocol_framework`)
FRAMEWORK_TARGET = "framework"


@dataclass(frozen=True)
class Derived:
    """A switch value that depends on the cell's other values (``compute(values)``), shown as ``text``."""

    text: str
    compute: Callable[[dict[str, Any]], Any]

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class DatasetCondition:
    """Which datasets a switch concerns: ``test(info, framework)`` asks the dataset's paper settings (its evaluation,
    OHEM, auxiliary head, the framework's publication on it), never its name; ``text`` says it in the docs."""

    text: str
    test: Callable[[DatasetInfo, str], bool]

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Switch:
    """One difference between the released code and the paper done right.

    ``target``: the dotted configuration key the switch sets (None = not yet implemented; ``framework``: the
    framework class, chosen by :func:`protocol_framework`);
    ``frameworks`` / ``heads``: the cells it applies to (None = all); ``needs_lists``: applies only where
    the dataset has that partition-list source; ``datasets``: only on the datasets that meet this condition on
    their paper settings (a synthetic stand-in has its real dataset's). ``rows``: a Markdown link to the entry
    of ``docs/deviations.md`` that describes the difference. Exactly one of ``golden`` (the test that runs the
    official function next to ours with the released value, ``tests/test_x.py::test_y``, and the max |difference|
    it records) and ``no_golden`` (why no function-level comparison exists, and the test that checks the value).
    """

    name: str
    owner: Owner
    target: str | None
    released: Any
    corrected: Any
    source: str
    changes: str
    rows: str
    frameworks: tuple[str, ...] | None = None
    heads: tuple[str, ...] | None = None
    needs_lists: str | None = None
    datasets: DatasetCondition | None = None
    golden: str = ""
    no_golden: str = ""

    def value(self, protocol: str, values: dict[str, Any] | None = None) -> Any:
        """The switch's value under ``protocol`` (a :class:`Derived` one computed from the cell's ``values``)."""
        value = self.released if check_protocol(protocol) == "released" else self.corrected
        return value.compute(values or {}) if isinstance(value, Derived) else value

    def applies(self, *, framework: str, dataset: str, head: str) -> bool:
        """Whether the switch is implemented and concerns the cell."""
        if self.target is None:
            return False
        if self.frameworks is not None and framework not in self.frameworks:
            return False
        if self.heads is not None and head not in self.heads:
            return False
        info = dataset_info(dataset)
        if self.datasets is not None and not self.datasets.test(info, framework):
            return False
        return self.needs_lists is None or self.needs_lists in info.partition_list_sources


def _publication_epochs(values: dict[str, Any]) -> int:
    """The epochs of the framework's own publication on the cell's dataset and partition (``Framework.own_epochs``:
    the dataset's settings); the shared ones where it has none."""
    info = dataset_info(values["dataset"])
    own = framework_spec(values["framework"]).own_epochs(info, info.resolve_partition(str(values["partition"])))
    return own if own is not None else _shared_epochs(values)


def _shared_epochs(values: dict[str, Any]) -> int:
    """The shared schedule's epochs on the cell's dataset for its framework (``Framework.shared_epochs``)."""
    return framework_spec(values["framework"]).shared_epochs(dataset_info(values["dataset"]).settings)


def _own_epochs_differ(info: DatasetInfo, framework: str) -> bool:
    """Whether the framework's publication on the dataset trains other epochs than the shared schedule."""
    framework_cls = framework_spec(framework)
    publication = framework_cls.publication_on(info.settings)
    return publication is not None and publication.epochs not in (None, framework_cls.shared_epochs(info.settings))


#: the datasets the dataset-specific switches concern, by what their paper settings say
_CENTER_CROP = DatasetCondition("datasets evaluated on a center crop (VOC)",
                                lambda info, framework: info.settings.eval_mode == "center_crop")
_NOT_SLIDING = DatasetCondition("datasets evaluated without sliding windows (VOC)",
                                lambda info, framework: info.settings.eval_mode != "sliding")
_SLIDING = DatasetCondition("datasets evaluated by sliding windows (Cityscapes)",
                            lambda info, framework: info.settings.eval_mode == "sliding")
_OHEM = DatasetCondition("datasets trained with OHEM (Cityscapes)", lambda info, framework: info.settings.ohem is not None)
_AUX = DatasetCondition("datasets trained with the auxiliary head (Cityscapes)",
                        lambda info, framework: info.settings.aux_weight is not None)
_WEIGHT_DECAY = DatasetCondition("datasets whose weight decay is not 1e-4 (Cityscapes)",
                                 lambda info, framework: info.settings.weight_decay != 1e-4)
_OWN_EPOCHS = DatasetCondition("datasets where the framework's publication trains epochs of its own (Cityscapes)",
                               _own_epochs_differ)


def _head_grad_clip(values: dict[str, Any]) -> float | None:
    """The cell's head's own clipping (``ClassifierHead.paper_grad_clip``: NP 5.0, the others none)."""
    return head_spec(values["head"]["name"]).paper_grad_clip


def _official_data_order(values: dict[str, Any]) -> str:
    """The official scripts' data order of the cell's framework (D24): U2PL's and AugSeg's ``voc_dset`` draw their
    lists once per run, UniMatch's ``SemiDataset`` repeats the labeled ids, TorchSemiSeg's too (``BaseDataset``) and
    never gives the unlabeled sampler its epoch, PS-MT cycles its labeled loader's first pass of each epoch."""
    if values["framework"] in ("u2pl", "augseg"):
        return "shared_sampled"
    if values["framework"] == "psmt":
        return "cycled_labeled"
    return "shared_repeated_frozen" if values["framework"] in _MT else "shared_repeated"


_NP = ("np",)
#: the golden tests (official function and ours on the same inputs; the max |difference| each records)
_GOLDEN_NP_HEAD = ("tests/test_np_head_golden.py::test_np_head_reproduces_the_authors_centers_latent_kl_and_logits: "
                   "max |difference| 1.5e-6 (logits; centers 1.2e-7, KL 1.1e-6)")
_GOLDEN_U2PL_CONTRASTIVE = ("tests/test_u2pl_contrastive_golden.py::test_released_contrastive_loss_reproduces_the_released_"
                            "code: loss 0 over two steps; membership and queues equal")
_GOLDEN_MT_CPS = ("tests/test_mt_cps_golden.py::test_one_released_step_matches_the_official_step: max |difference| 3.0e-7 "
                  "(teacher probabilities; losses 0; gradients 2.4e-5, weight sums 4.4e-6 relative)")
_GOLDEN_PSMT_TVAT = ("tests/test_psmt_tvat_golden.py::test_released_tvat_reproduces_the_two_released_calls: max |difference| "
                     "6.2e-9 of the perturbation's size (float64; float32 is rounding noise at xi = 1e-6, not recorded)")
_GOLDEN_PSMT_EVAL = ("tests/test_psmt_eval_golden.py::test_released_evaluation_reproduces_psmt_valid_epoch: max |difference| "
                     "2.4e-7 (probabilities)")
_GOLDEN_PSMT_STEP = ("tests/test_psmt_step_golden.py::test_one_released_step_matches_the_official_step: max |difference| "
                     "5.4e-7 relative (gradients; weights and BN buffers 1.3e-7, losses 2.3e-8; float64 step)")
_GOLDEN_AUGSEG_NP_TARGETS = ("tests/test_augseg_np_targets_golden.py::test_released_targets_are_the_official_unfiltered_ones: "
                             "targets equal (0), AugSeg's step; U2PL's not compared")
#: the whole-step goldens of FixMatch and UniMatch (official loop body and train_step on one network)
_GOLDEN_UNIMATCH_STEPS = ("tests/test_unimatch_step_golden.py::test_one_released_step_matches_the_official_step: max "
                          "|difference| 4.5e-7 relative (VOC settings 3.2e-7, Cityscapes 4.5e-7; every loss, gradient, "
                          "parameter and BN buffer of one step, float64 network, float32 losses); "
                          "tests/test_fixmatch_step_golden.py::test_one_released_step_matches_the_official_step: 5.7e-7 "
                          "(VOC 3.6e-7, Cityscapes 5.7e-7); each switch moves the step: "
                          "tests/test_unimatch_step_golden.py::test_each_guarded_behaviour_moves_the_step")
_GOLDEN_U2PL_STEP = ("tests/test_u2pl_step_golden.py::test_one_released_step_matches_the_official_iteration: "
                     "max |difference| 2.4e-6 relative (gradients; parameters 9.2e-7, losses 1.1e-7, BN buffers and "
                     "memory bank 0), a supervised-only step, the first semi-supervised epoch and a later one")
_GOLDEN_NP_U2PL_STEP = ("tests/test_np_u2pl_step_golden.py::test_one_released_step_matches_the_authors_iteration: "
                        "max |difference| 1.9e-6 relative (gradients after the clipping; parameters 1.1e-7, losses "
                        "2.3e-7, NP centers 3.0e-8, BN buffers and memory bank 0), a supervised-only step, the first "
                        "semi-supervised epoch and a later one")
_GOLDEN_NP_AUGSEG_STEP = ("tests/test_np_augseg_step_golden.py::test_two_released_steps_match_the_authors_iterations: "
                          "two steps, max |difference| 1.5e-4 relative (parameters; losses 1.1e-7, NP centers 9.5e-6, BN "
                          "buffers 6.8e-6; the second step's gradients not compared)")
#: the whole-step goldens of UniMatch V2 and its FixMatch (official loop bodies and train_step on the tiny DPT)
_GOLDEN_UNIMATCH_V2_STEPS = ("tests/test_unimatch_v2_golden.py::test_gradients_the_adamw_step_and_the_ema_teacher_equal_the_"
                             "official_step: max |difference| 1.1e-6 relative (gradient sums; losses 2.6e-8, gradient "
                             "entries 5.9e-8, parameters after AdamW 2.2e-8), the data pipeline's batch, the released "
                             "baseline head (the official 1x1 projection); float64 networks, float32 losses")
#: both mean teachers: the shared-trainer one and CPS's (what switch ``mt_framework`` chooses between)
_MT = ("mt", "mt_cps")
#: UniMatch and its FixMatch (one code base, LiheYoung/UniMatch@0324f3d)
_UNIMATCH = ("fixmatch", "unimatch")
#: UniMatch V2's repository (LiheYoung/UniMatch-V2@f6afb4d unimatch_v2.py 216-219, fixmatch.py: the LR set after the step)
_UNIMATCH_V2 = ("unimatch_v2", "fixmatch_v2")
_SWITCH_LIST: tuple[Switch, ...] = (
    # ---------------------------------------------------------------- evaluation
    Switch("evaluation_select", "evaluation", "evaluation.select", "best", "last",
           "U2PL@ab3d2be train_semi.py 218-222 (ckpt_best.pth); AugSeg@7ead870 train_semi.py; NP-SemiSeg@afd9672 "
           "U2PL/train_semi.py 250, U2PL/experiments/cityscapes/744/np/eval.sh 14 (loads ckpt_best); "
           "UniMatch@0324f3d unimatch.py 222-246, fixmatch.py 197-221 (every epoch evaluated, best.pth)",
           "reports the best validation epoch's weights instead of the last epoch's (both are logged)",
           "[D2](deviations.md#d2-best-epoch-reporting)",
           no_golden="which checkpoint the training script keeps: no function; "
                     "tests/test_training.py::test_checkpoint_selection_reports_and_restores_the_best_epoch"),
    Switch("np_eval_samples", "evaluation", "evaluation.num_samples", 20, 5,
           "NP-SemiSeg@afd9672 U2PL/eval.py 172 (T = 20; the paper says 5)", "T latent samples averaged at evaluation",
           "[N7](deviations.md#n7-samples-at-evaluation)", heads=_NP,
           no_golden="a constant of the evaluation script (T = 20): no function; "
                     "tests/test_protocol.py::test_protocol_sets_every_switch_on_the_paper_preset"),
    Switch("fp32", "loop", "runtime.amp", False, True, "every official trainer (fp32)",
           "bf16 autocast on GPU (corrected) or float32 (released)", "[D15](deviations.md#d15-precision-and-upsampling)",
           no_golden="the precision of whole trainers: no function; "
                     "tests/test_protocol_switches.py::test_fp32_switch_turns_autocast_off"),
    # ---------------------------------------------------------------- NP head
    Switch("np_attention", "head", "head.options.attention", "per_channel", "euclidean",
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/np_head.py 200-214 (attention over squared per-channel residuals)",
           "softmax over classes per channel instead of one Euclidean distance per class",
           "[N5](deviations.md#n5-per-channel-attention)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_kl", "head", "head.options.kl", "authors", "paper",
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 447-448 (KL with sigma as variance)",
           "closed-form Gaussian KL with sigma used where sigma^2 belongs",
           "[N4](deviations.md#n4-kl-with-sigma-as-a-variance)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_zero_centers", "head", "head.options.mask_empty", False, True,
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/np_head.py 183-189 (a center for every class), 203-214 (every "
           "class in the softmax)",
           "classes with empty memories take part in attention with a zero center",
           "[N6](deviations.md#n6-memory-contents)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_sync_memories", "head", "head.options.sync_memories", False, True,
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/np_head.py 166-180 (no all_gather of memories)",
           "each rank enqueues only its own pixels",
           "[N6](deviations.md#n6-memory-contents)", heads=_NP,
           no_golden="needs several processes: per rank the released head (no gather, as the official one) is the "
                     "one-process head of the NP golden, which cannot run ranks; the corrected gather: "
                     "tests/test_heads_ddp.py::test_memories_and_centers_identical_across_ranks"),
    Switch("np_push_every_pixel", "head", "head.options.enqueue_per_class", None,
           "auto",
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/np_head.py 166-180 (masked_select of every pixel, FIFO to Q)",
           "every pixel of a class enters the memory each step (the memory is the last image) "
           "instead of a bounded random subset", "[N6](deviations.md#n6-memory-contents)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_sample_ce", "head", "head.sample_ce", "mean_logits", "elbo",
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 620-625", "CE on the mean of the T logits instead of the mean of "
           "per-sample CEs", "[D4](deviations.md#d4-np-targets-and-ce-in-u2pl)", heads=_NP,
           no_golden="a loss line of the whole training script: no function; by hand in "
                     "tests/test_training.py::test_sample_cross_entropy_forms_by_hand"),
    Switch("np_scrambled_memories", "head", "head.options.memory_rows", "scrambled", "pixel",
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/np_head.py 169, 177 (masked_select(...).view(-1, 32))",
           "memory rows hold one channel of many pixels, not one pixel's feature vector",
           "[N1](deviations.md#n1-scrambled-memories)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_memories_persist", "head", "head.options.persist_memories", False, True,
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 119, 126-133, 414 (lists passed through the DDP forward, torch 1.10)",
           "memories never persist: each training step starts empty, every inference uses all-zero centers",
           "[N2](deviations.md#n2-memories-that-never-persist)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_memory_zero_row", "head", "head.options.memory_zero_row", True, False,
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 129-133 (zeros(1, 32) per class), U2PL/u2pl/models/np_head.py "
           "170, 178 (rows appended to it), 171-173, 179-181 (dropped only past Q rows), 186-187 (the mean)",
           "each memory starts with one zero row that counts in its center (n / (n + 1) of the pixels' mean "
           "while fewer than Q rows arrive)", "[N6](deviations.md#n6-memory-contents)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_memory_stream", "head", "head.options.enqueue_order", "stream", "random",
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/np_head.py 169-173, 177-181 (masked_select order, the last Q rows "
           "kept)",
           "a memory takes the last rows of the batch in masked_select order (image by image, raster order, so "
           "the last image's last channels) instead of a random subset of the batch's pixels",
           "[N8](deviations.md#n8-which-rows-a-memory-takes)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_memory_label_size", "head", "head.options.memory_resolution", "labels", "features",
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/np_head.py 149-163 (features upsampled to the label size before "
           "the small ConvNet)",
           "memory rows from the features upsampled (bilinear, align_corners) to label size, instead of the "
           "query at feature size with nearest-downsampled labels",
           "[N8](deviations.md#n8-which-rows-a-memory-takes)", heads=_NP,
           golden=_GOLDEN_NP_HEAD),
    Switch("np_feature_pool", "head", "head.options.feature_pool", 1, "coarse",
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/decoder.py 146-147 (the NP head reads the decoder's last map); "
           "the authors never ran a ViT",
           "the NP head reads the decoder's last map as it is (on the DPT: 296 x 296 at crop 518, T samples there) "
           "instead of the decoder's coarse level (on the DPT its map averaged over 4 x 4 cells, the 1/7 map; "
           "on DeepLabv3+ the map as it is), its logits upsampled after it",
           "[docs/vit.md](vit.md#where-the-np-head-reads-the-dpt)", heads=_NP,
           no_golden="the released value is the head every NP golden runs (feature_pool=1); the corrected value: "
                     "tests/test_np_feature_pool.py::test_protocol_pools_the_dpt_map_under_corrected_only"),
    Switch("np_unfiltered_targets", "framework", "framework_options.np_targets", "unfiltered", "filtered",
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 406-411, AugSeg/train_semi.py 405-408",
           "NP memories and KL targets from unfiltered pseudo-labels",
           "[D4](deviations.md#d4-np-targets-and-ce-in-u2pl)", frameworks=("u2pl", "augseg"), heads=_NP,
           golden=_GOLDEN_AUGSEG_NP_TARGETS),
    Switch("np_sup_only_kl", "framework", "framework_options.sup_only_kl", False, True,
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 328-355 (kl_divergence = 0 in the supervised-only epochs), 621",
           "no KL term during U2PL's supervised-only epochs",
           "[N4](deviations.md#n4-kl-with-sigma-as-a-variance)", frameworks=("u2pl",), heads=_NP,
           no_golden="the epoch loop of the whole training script: no function; "
                     "tests/test_frameworks.py::test_u2pl_np_kl_during_the_supervised_only_epochs"),
    Switch("np_context_pass", "framework", "framework_options.np_context", "pass", "slice",
           "NP-SemiSeg@afd9672 U2PL/u2pl/models/model_helper.py 78, 89-91, U2PL/u2pl/models/decoder.py 124-134; "
           "AugSeg/augseg/models/model_helper.py 109-111, AugSeg/augseg/models/decoder.py 68-78",
           "the NP context features come from an encoder-decoder pass of their own over the labeled images (their "
           "own BN batch and BN update, dropout masks) instead of the labeled slice of the student's one pass",
           "[D4](deviations.md#d4-np-targets-and-ce-in-u2pl)", frameworks=("u2pl", "augseg"), heads=_NP,
           golden=_GOLDEN_NP_U2PL_STEP),
    Switch("entropy_log_offset", "framework", "framework_options.entropy_log", "offset", "clamp",
           "U2PL@ab3d2be u2pl/utils/loss_helper.py 35-36, train_semi.py (contrastive masks); AugSeg@7ead870 "
           "train_semi.py 331; NP-SemiSeg@afd9672 U2PL/train_semi.py 499-500, AugSeg/train_semi.py 366",
           "the teacher's entropy (U2PL's filter and contrastive masks, AugSeg's adaptive confidence) takes "
           "log(p + 1e-10), as the authors, instead of log(max(p, 1e-12)): the offset moves every class's term by up "
           "to 1e-10, enough to reorder pixels tied at a percentile threshold; the clamp is the entropy of p itself "
           "at round-off", "[D21](deviations.md#d21-entropy-logarithm)", frameworks=("u2pl", "augseg"),
           no_golden="the form of one logarithm, within the step goldens' tolerance (they run under it): "
                     "tests/test_protocol_switches.py::test_released_entropy_takes_the_authors_log_p_plus_1e_10"),
    Switch("augseg_np_memories", "framework", "framework_options.np_memories", "swapped", "head",
           "NP-SemiSeg@afd9672 AugSeg/train_semi.py 310-315 (the teacher's centers from the epoch's initial lists), "
           "408 (model(image_all, latent_memory, deterministic_memory, ...) returns them as (deterministic_memory, "
           "latent_memory)), AugSeg/augseg/models/model_helper.py 50",
           "the NP memories carry over from step to step within an epoch with target and context exchanged at every "
           "step, and start again from their zero rows at each epoch (the teacher keeps all-zero centers)",
           "[N2](deviations.md#n2-memories-that-never-persist)", frameworks=("augseg",), heads=_NP,
           golden=_GOLDEN_NP_AUGSEG_STEP),
    Switch("u2pl_entropy_mean_logits", "framework", "framework_options.teacher_entropy", "mean_logits", "mean_probs",
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 468-480 (pred_all_teacher = out_t['pred'].mean(0)), 489-492, "
           "510-512",
           "the statistics pass's entropy (unsupervised filter, contrastive masks) is that of the softmax of the mean "
           "of the T logits, not of the mean of the T softmaxes", "[D4](deviations.md#d4-np-targets-and-ce-in-u2pl)",
           frameworks=("u2pl",), heads=_NP, golden=_GOLDEN_NP_U2PL_STEP),
    # ---------------------------------------------------------------- U2PL
    Switch("u2pl_teacher_train_mode", "framework", "framework_options.teacher_train_mode", True, False,
           "U2PL@ab3d2be train_semi.py 361-374", "the statistics pass runs the teacher in train mode (updates its BN "
           "statistics)", "[D5](deviations.md#d5-u2pl-teacher-mode-and-label-padding)", frameworks=("u2pl",),
           golden=_GOLDEN_U2PL_STEP),
    Switch("u2pl_teacher_buffers", "framework", "framework_options.ema_buffers", "none", "ema",
           "U2PL@ab3d2be train_semi.py 543-548 (EMA over parameters() only); NP-SemiSeg@afd9672 U2PL/train_semi.py",
           "the teacher's BN statistics are its own (from its train-mode passes), not an EMA of the student's",
           "[D5](deviations.md#d5-u2pl-teacher-mode-and-label-padding)", frameworks=("u2pl",),
           golden=_GOLDEN_U2PL_STEP),
    Switch("u2pl_teacher_reset", "framework", "framework_options.teacher_reset", "share", "copy",
           "U2PL@ab3d2be train_semi.py 309-315 (t_params.data = s_params.data); NP-SemiSeg@afd9672 U2PL/train_semi.py "
           "357-363",
           "in the first semi-supervised epoch the teacher takes the student's parameters (before and after the "
           "optimiser step, as shared storage) and keeps its own BN statistics, instead of a full copy followed by "
           "the EMA", "[D5](deviations.md#d5-u2pl-teacher-mode-and-label-padding)", frameworks=("u2pl",),
           golden=_GOLDEN_U2PL_STEP),
    Switch("u2pl_sup_only_zero_terms", "framework", "framework_options.sup_only_zero_terms", True, False,
           "U2PL@ab3d2be train_semi.py 305-306 (unsup_loss = contra_loss = 0 * rep.sum()); NP-SemiSeg@afd9672 "
           "U2PL/train_semi.py 352-353",
           "in the supervised-only epochs the representation head gets zero gradients, so weight decay and momentum "
           "move it", "[D5](deviations.md#d5-u2pl-teacher-mode-and-label-padding)", frameworks=("u2pl",),
           golden=_GOLDEN_NP_U2PL_STEP),
    Switch("u2pl_label_pad", "data", "data.augmentation.label_pad_value", 0, 255, "U2PL@ab3d2be u2pl/dataset/augmentation.py 243",
           "weak crops pad labels with background (0) instead of ignore (255)",
           "[D5](deviations.md#d5-u2pl-teacher-mode-and-label-padding)",
           frameworks=("u2pl",),
           golden="tests/test_u2pl_label_pad_golden.py::test_released_crop_reproduces_u2pl_crop: max |difference| "
                  "0 (labels), 4.8e-7 (normalised images)"),
    Switch("u2pl_resize", "data", "data.augmentation.resize_resample", "interpolate", "antialiased",
           "U2PL@ab3d2be u2pl/dataset/augmentation.py 190-211 (RandResize: F.interpolate bilinear, align_corners=False, "
           "labels mode='nearest', size int(s * side)); NP-SemiSeg@afd9672 U2PL/u2pl/dataset/augmentation.py (the same "
           "file)",
           "the random rescale resamples the image without antialiasing, the label with torch's legacy nearest (up to "
           "half a source pixel off the image) and floors the size, instead of an antialiased image, pixel-centred "
           "labels and a rounded size",
           "[D23](deviations.md#d23-u2pl-rescale)", frameworks=("u2pl",),
           golden="tests/test_u2pl_resize_golden.py::test_released_rescale_reproduces_u2pl_randresize: max "
                  "|difference| 0 (labels), 4.8e-7 (normalised images)"),
    Switch("mt_cps_scales", "data", "data.augmentation.scale_choices", [0.5, 0.75, 1.0, 1.5, 1.75, 2.0], None,
           "TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher/config.py 107 (C.train_scale_array), dataloader.py "
           "27-34 (random_scale: random.choice)",
           "the random rescale draws one of TorchSemiSeg's six scales, each as likely, instead of U2PL's s in "
           "U[0.5, 1] or U[1, 2]",
           "[D25](deviations.md#d25-torchsemiseg-rescale)", frameworks=_MT,
           golden="tests/test_mt_cps_rescale_golden.py::test_released_rescale_reproduces_torchsemiseg_train_pre: "
                  "each of the six scales, labels exact, images within one uint8 level (max |difference| 1.3e-2 "
                  "normalised; TorchSemiSeg resizes the uint8 image)"),
    Switch("mt_cps_resize", "data", "data.augmentation.resize_resample", "interpolate", "antialiased",
           "TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher/dataloader.py 27-34 (cv2.resize INTER_LINEAR, "
           "labels INTER_NEAREST, size int(s * side))",
           "the random rescale resamples the image bilinearly without antialiasing, the label with the legacy "
           "nearest, and floors the size (OpenCV's INTER_LINEAR and INTER_NEAREST sample the points of U2PL's "
           "interpolate), instead of an antialiased image, pixel-centred labels and a rounded size",
           "[D25](deviations.md#d25-torchsemiseg-rescale)", frameworks=_MT,
           golden="tests/test_mt_cps_rescale_golden.py::test_released_rescale_reproduces_torchsemiseg_train_pre: "
                  "labels exact, images within one uint8 level (max |difference| 1.3e-2 normalised)"),
    Switch("u2pl_label_onehot", "framework", "framework_options.label_onehot_bug", True, False,
           "U2PL@ab3d2be u2pl/utils/utils.py 50-59",
           "only image 0 of each batch gets (multi-hot) labels in the contrastive loss",
           "[D3 a](deviations.md#d3-u2pl-contrastive-loss)",
           frameworks=("u2pl",),
           golden=_GOLDEN_U2PL_CONTRASTIVE),
    Switch("u2pl_label_onehot_ignored", "framework", "framework_options.label_onehot_ignored_bug", True, False,
           "U2PL@ab3d2be u2pl/utils/utils.py 54-57 (255 set to 0 before the scatter; the clearing reaches each "
           "image's own slot only), train_semi.py 456-465; the same in NP-SemiSeg@afd9672 U2PL/u2pl/utils/utils.py",
           "with u2pl_label_onehot: the ignored pixels of every image of a part count as class 0 in its first "
           "image's slot, except where the first image itself ignores the pixel (there it has no class)",
           "[D3 a](deviations.md#d3-u2pl-contrastive-loss)", frameworks=("u2pl",),
           golden=_GOLDEN_U2PL_CONTRASTIVE),
    Switch("u2pl_labeled_negatives", "framework", "framework_options.labeled_negatives_bug", True, False,
           "U2PL@ab3d2be u2pl/utils/loss_helper.py 127-140 (U2PL issue #171)",
           "negative masks also require class membership: labeled negatives impossible",
           "[D3 b](deviations.md#d3-u2pl-contrastive-loss)", frameworks=("u2pl",),
           golden=_GOLDEN_U2PL_CONTRASTIVE),
    Switch("u2pl_prototype_index", "framework", "framework_options.prototype_index_bug", True, False,
           "U2PL@ab3d2be u2pl/utils/loss_helper.py 173-188 (U2PL issue #111)",
           "anchors and prototypes indexed by position, not class",
           "[D3 c](deviations.md#d3-u2pl-contrastive-loss)", frameworks=("u2pl",),
           golden=_GOLDEN_U2PL_CONTRASTIVE),
    # ---------------------------------------------------------------- MT
    Switch("mt_framework", "framework", FRAMEWORK_TARGET, "mt_cps", "mt",
           "TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher config.py 73-107, train.py 180-213",
           "MT cells run CPS's MeanTeacher, framework mt_cps: MSE between softmaxes x 100, one weak view, no "
           "CutMix, the student evaluated", "[D1](deviations.md#d1-mt-as-cpss-meanteacher)", frameworks=_MT,
           golden=_GOLDEN_MT_CPS),
    Switch("mt_cps_split_passes", "framework", "framework_options.passes", "split", "joint",
           "TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher train.py 180-183 (model(imgs), then "
           "model(unsup_imgs))",
           "the labeled and the unlabeled half in two forwards of student and teacher: every BN normalises each half "
           "with its own statistics", "[D1](deviations.md#d1-mt-as-cpss-meanteacher)", frameworks=("mt_cps",),
           golden=_GOLDEN_MT_CPS),
    Switch("mt_cps_ema_before_unlabeled", "framework", "framework_options.ema_timing", "before_unlabeled",
           "after_step",
           "TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher network.py 35-41, 45-47 (EMA inside the labeled "
           "call), train.py 213-215 (optimiser step after both calls)",
           "the teacher's EMA from the student before this step's optimiser step, before the teacher predicts the "
           "unlabeled half, instead of after the step", "[D1](deviations.md#d1-mt-as-cpss-meanteacher)",
           frameworks=("mt_cps",),
           golden=_GOLDEN_MT_CPS),
    Switch("mt_cps_no_dropout", "framework", "framework_options.train_dropout", False, True,
           "TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher network.py 61-67, 97-149, 169-201 (ASPP, Head "
           "and classifier without dropout)",
           "no train-only dropout in student and teacher (the U2PL decoder's ASPP dropout and the baseline "
           "classifier's two, 0.1 each); MC dropout stays", "[D1](deviations.md#d1-mt-as-cpss-meanteacher)",
           frameworks=("mt_cps",),
           golden=_GOLDEN_MT_CPS),
    Switch("mt_select_from_epoch", "evaluation", "evaluation.select_from_epoch", 21, 0,
           "TorchSemiSeg@5e0c29c MeanTeacher script.sh (eval.py -e 20-34), furnace/engine/engine.py 150-151 "
           "(epoch-N.pth is saved after the 0-based epoch N, so epoch-20.pth after 21 epochs)",
           "the best epoch is chosen among the evaluations after 21 or more completed epochs only (the checkpoints "
           "epoch-20.pth to epoch-33.pth; with evaluation_select = best)",
           "[D2](deviations.md#d2-best-epoch-reporting)", frameworks=_MT,
           no_golden="an argument of the evaluation script: no function; "
                     "tests/test_training.py::test_best_epoch_candidates_start_at_select_from_epoch"),
    Switch("mt_single_lr", "loop", "optim.parameter_groups", "single_lr", "backbone_head",
           "TorchSemiSeg@5e0c29c MeanTeacher train.py 95-100 (group_weight at base_lr for backbone and head), "
           "furnace/utils/init_func.py 44-75",
           "one LR (optim.lr) for every parameter instead of the head at 10x, and no weight decay on BN and biases",
           "[P](deviations.md#provenance-of-the-papers-rows)", frameworks=_MT,
           no_golden="the optimiser's groups in the training script: no function; "
                     "tests/test_protocol_switches.py::test_single_lr_switches_group_the_parameters"),
    # ---------------------------------------------------------------- PS-MT
    Switch("psmt_tvat_released", "framework", "framework_options.tvat_released_normalization", True, False,
           "PS-MT@058cdc3 VocCode/Model/Deeplabv3_plus/encoder_decoder.py 53-89",
           "float32 power iteration at xi = 1e-6 (almost no perturbation)",
           "[D16](deviations.md#d16-ps-mt-t-vat)", frameworks=("psmt",),
           golden=_GOLDEN_PSMT_TVAT),
    Switch("psmt_tvat_crop_kl", "framework", "framework_options.tvat_kl_at_crop_size", True, False,
           "PS-MT@058cdc3 VocCode/Model/Deeplabv3_plus/encoder_decoder.py 136-154 (the decoder upsamples before the KL)",
           "T-VAT's KL between crop-size predictions instead of feature-size ones (a pixel weighting of the direction)",
           "[D16](deviations.md#d16-ps-mt-t-vat)", frameworks=("psmt",),
           golden=_GOLDEN_PSMT_TVAT),
    Switch("psmt_tvat_per_batch", "framework", "framework_options.tvat_per_batch", True, False,
           "PS-MT@058cdc3 VocCode/Model/Deeplabv3_plus/EntireModel.py 60, 64 (the student decoder called on the "
           "labeled and on the unlabeled features), encoder_decoder.py 59-89 (get_r_adv_t), 148-151",
           "T-VAT searched once per batch (labeled, unlabeled) instead of once on both: with the released "
           "normalisation the perturbation's size scales with 1 / (images searched together)",
           "[D16](deviations.md#d16-ps-mt-t-vat)", frameworks=("psmt",),
           golden=_GOLDEN_PSMT_TVAT),
    Switch("psmt_split_passes", "framework", "framework_options.student_passes", "split", "joint",
           "PS-MT@058cdc3 VocCode/Model/Deeplabv3_plus/EntireModel.py 60, 64 (encoder_s and decoder_s called on the "
           "labeled, then on the unlabeled images)",
           "the labeled and the unlabeled images in two student passes (each part its own BN batch, two BN updates, "
           "its own T-VAT search and head call) instead of one",
           "[D10](deviations.md#d10-ps-mt-learning-rates)", frameworks=("psmt",),
           golden=_GOLDEN_PSMT_STEP),
    Switch("psmt_warmup_epochs", "framework", "framework_options.warmup_epochs", 5, 0,
           "PS-MT@058cdc3 VocCode/Base/base_trainer.py 137-145 and VocCode/train.py 139-187 (_warm_up), scripts "
           "--warm_up=5",
           "supervised warm-up epochs before the semi-supervised phase, in which teacher 1, teacher 2 (models of "
           "their own, weak view, optimisers of their own) and the student (strong view) each train on the labeled "
           "batch", "[D7](deviations.md#d7-ps-mt-warm-up)", frameworks=("psmt",),
           no_golden="a trainer method bound to the whole training script: "
                     "tests/test_protocol_switches.py::test_psmt_warm_up_trains_each_teacher_with_an_optimiser_of_its_own"),
    Switch("psmt_warmup_teachers_scratch", "framework", "framework_options.warmup_teacher_backbones", "scratch",
           "pretrained",
           "PS-MT@058cdc3 VocCode/Model/Deeplabv3_plus/EntireModel.py 15-24 (encoder1, encoder2 with "
           "pretrained_model=None; encoder_s from the ImageNet file)",
           "the warm-up teachers' backbones start from a random initialisation instead of the run's (ImageNet) "
           "weights (only with psmt_warmup_epochs)", "[D7](deviations.md#d7-ps-mt-warm-up)", frameworks=("psmt",),
           no_golden="the teachers' initial weights (no weights file): "
                     "tests/test_protocol_switches.py::test_psmt_warmup_teachers_scratch_switch_redraws_the_teachers_backbones"),
    Switch("psmt_teacher_train_mode", "framework", "framework_options.teacher_train_mode", True, False,
           "PS-MT@058cdc3 VocCode/train.py 192",
           "teachers predict in train mode (BN on the weak batch)",
           "[D6](deviations.md#d6-ps-mt-teachers-in-train-mode)", frameworks=("psmt",),
           no_golden="a line inside the official step (VocCode/train.py, a method of the whole Trainer): not "
                     "compared; tests/test_protocol_switches.py::test_train_mode_teachers_update_their_bn_statistics"),
    Switch("psmt_epochs", "loop", "schedule.epochs", Derived("PS-MT's own", _publication_epochs),
           Derived("shared", _shared_epochs), "PS-MT@058cdc3 scripts/train_voc_blender.sh, train_city.sh, docs/before_start.md",
           "PS-MT's own epoch counts (VOC blender 80/80/200/300 for 662/1323/2646/5291, classic 80; Cityscapes "
           "320/450/550 for 372/744/1488) instead of the shared 80 / 200",
           "[D8](deviations.md#d8-ps-mt-epochs)", frameworks=("psmt",),
           no_golden="schedule values from the scripts: no function; "
                     "tests/test_protocol_switches.py::test_psmt_epochs_switch_sets_psmt_epoch_counts"),
    Switch("psmt_cityscapes_plain_ce", "framework", "loss.ohem", False, True,
           "PS-MT@058cdc3 CityCode/Model/Deeplabv3_plus/EntireModel.py 62",
           "Cityscapes supervised loss is plain CE (the config says OHEM)",
           "[D9](deviations.md#d9-ps-mt-cityscapes-loss)", frameworks=("psmt",),
           datasets=_OHEM,
           no_golden="the loss the model builds (a constructor argument): no function; "
                     "tests/test_protocol_switches.py::test_psmt_cityscapes_plain_ce"),
    Switch("psmt_single_lr", "loop", "optim.parameter_groups", "single_lr", "backbone_head",
           "PS-MT@058cdc3 VocCode/Utils/helpers.py 38-77 (group_weight), VocCode/Base/base_trainer.py 88-115",
           "one LR (optim.lr) for every parameter instead of the head at 10x, and no weight decay on BN and biases",
           "[D10](deviations.md#d10-ps-mt-learning-rates)", frameworks=("psmt",),
           no_golden="the optimiser's groups in the trainer: no function; "
                     "tests/test_protocol_switches.py::test_single_lr_switches_group_the_parameters"),
    Switch("psmt_eval_logits", "evaluation", "framework_options.eval_average", "logits", "probabilities",
           "PS-MT@058cdc3 VocCode/train.py 332-333 ((output1 + output2) / 2)",
           "both teachers' logits averaged instead of their softmaxes",
           "[D11](deviations.md#d11-ps-mt-evaluation)", frameworks=("psmt",),
           datasets=_NOT_SLIDING,
           golden=_GOLDEN_PSMT_EVAL),
    Switch("psmt_eval_whole", "evaluation", "evaluation.mode", "whole",
           Derived("the preset's or the dataset's", lambda values: values.get("evaluation", {}).get("mode")),
           "PS-MT@058cdc3 VocCode/configs/config_deeplab_v3+.json 61-68 (val_loader: no crop_size, no base_size), "
           "VocCode/Base/base_dataset.py 155-162 (_val_augmentation: normalisation only)",
           "VOC validation images evaluated whole (one per batch) instead of their 513 center crop",
           "[D11](deviations.md#d11-ps-mt-evaluation)", frameworks=("psmt",), datasets=_CENTER_CROP,
           golden=_GOLDEN_PSMT_EVAL),
    Switch("psmt_eval_resize", "evaluation", "evaluation.resize_multiple", 8, None,
           "PS-MT@058cdc3 VocCode/train.py 324-330 (image resized to ceil(H / 8) 8 x ceil(W / 8) 8, bilinear, "
           "align_corners), 101-118 (teachers' logits at that size), 333-337 (averaged, resized back to H x W)",
           "each evaluated image resized up to multiples of 8 and the logits resized back to the image size",
           "[D11](deviations.md#d11-ps-mt-evaluation)", frameworks=("psmt",), datasets=_NOT_SLIDING,
           golden=_GOLDEN_PSMT_EVAL),
    Switch("psmt_blur_kernel", "data", "data.augmentation.blur_kernel", "psmt", "sigma",
           "PS-MT@058cdc3 VocCode/Base/base_dataset.py 133-150 (data_aug)",
           "strong-view blur kernel 1/3/5 (p = 0.40/0.40/0.19; 1 = no blur) instead of 2 ceil(3 sigma) + 1",
           "[D17](deviations.md#d17-ps-mt-blur-kernel)", frameworks=("psmt",),
           golden="tests/test_psmt_blur_kernel_golden.py::test_released_kernel_draw_reproduces_psmt_data_aug: max "
                  "|difference| 0 (kernel for the same uniform number, 15 numbers)"),
    # ---------------------------------------------------------------- FixMatch / UniMatch (UniMatch@0324f3d)
    Switch("unimatch_voc_eval_whole", "evaluation", "evaluation.mode", "whole", "center_crop",
           "UniMatch@0324f3d unimatch.py 222, fixmatch.py 197 (eval_mode 'original' on VOC), supervised.py 59-66 "
           "(the whole image, no crop), dataset/semi.py 37-39 (val images as they are)",
           "VOC validation on whole images instead of the 513 px center crop",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_CENTER_CROP,
           no_golden="config and script values: no function; "
                     "tests/test_protocol_switches.py::test_unimatch_switches_set_the_official_evaluation_and_schedule"),
    Switch("unimatch_eval_window", "evaluation", "evaluation.crop_size", 801, 769,
           "UniMatch@0324f3d supervised.py 44-55 (grid = cfg['crop_size']), configs/cityscapes.yaml 4; "
           "unimatch.py 222, fixmatch.py 197 (sliding window at every epoch since 89fda6f; the first release "
           "7292bac used a center crop until the last 20 epochs)",
           "Cityscapes sliding-window size at evaluation (the training crop)",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_SLIDING,
           no_golden="config and script values: no function; "
                     "tests/test_protocol_switches.py::test_unimatch_switches_set_the_official_evaluation_and_schedule"),
    Switch("unimatch_eval_stride", "evaluation", "evaluation.stride", 534,
           Derived("ceil(2/3 x window), derived", lambda values: None),
           "UniMatch@0324f3d supervised.py 54-55 (int(grid * 2 / 3))",
           "Cityscapes sliding-window stride at evaluation",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_SLIDING,
           no_golden="config and script values: no function; "
                     "tests/test_protocol_switches.py::test_unimatch_switches_set_the_official_evaluation_and_schedule"),
    Switch("unimatch_eval_scheme", "evaluation", "evaluation.sliding_scheme", "augseg", "u2pl",
           "UniMatch@0324f3d supervised.py 44-57 (windows at every multiple of int(grid x 2/3) below the side, cut "
           "at the border; softmaxes summed, then argmax)",
           "Cityscapes sliding windows cut at the border with their probabilities summed, instead of the last "
           "window shifted inside the image and logits averaged",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_SLIDING,
           golden="tests/test_sliding_eval_golden.py::test_released_scheme_reproduces_unimatch_evaluate: windows "
                  "and predicted classes equal; the run's per-class IoU and pixel accuracy |difference| 0 "
                  "(tests/test_sliding_eval_golden.py::test_a_released_run_evaluates_as_unimatch); the corrected "
                  "scheme's classes differ: "
                  "tests/test_sliding_eval_golden.py::test_the_golden_tells_the_schemes_apart"),
    Switch("unimatch_ohem_min_kept", "loop", "loss.ohem_min_kept", 200_000, 100_000,
           "UniMatch@0324f3d configs/cityscapes.yaml 12-17 (OHEM thresh 0.7, min_kept 200000), unimatch.py 70-71, "
           "util/ohem.py 38-52",
           "Cityscapes OHEM keeps at least 200,000 pixels per process instead of the NP configs' 100,000",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_OHEM,
           no_golden="config and script values: no function; "
                     "tests/test_protocol_switches.py::test_unimatch_switches_set_the_official_evaluation_and_schedule"),
    Switch("unimatch_cityscapes_aux", "framework", "model.aux_head", False, True,
           "UniMatch@0324f3d model/semseg/deeplabv3plus.py 36-55 (no auxiliary head), unimatch.py 174, "
           "fixmatch.py 160 (loss_x = OHEM of the main output only)",
           "Cityscapes: OHEM without the auxiliary layer-3 head",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_AUX,
           no_golden="config and script values: no function; "
                     "tests/test_protocol_switches.py::test_unimatch_switches_set_the_official_evaluation_and_schedule"),
    Switch("unimatch_weight_decay", "loop", "optim.weight_decay", 1e-4, 5e-4,
           "UniMatch@0324f3d unimatch.py 54-56, fixmatch.py 57-59 (SGD weight_decay=1e-4 on every dataset)",
           "Cityscapes weight decay 1e-4 instead of the NP configs' 5e-4",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_WEIGHT_DECAY,
           no_golden="config and script values: no function; "
                     "tests/test_protocol_switches.py::test_unimatch_switches_set_the_official_evaluation_and_schedule"),
    Switch("unimatch_cps_lists", "data", "partition_lists", "cps", "u2pl",
           "UniMatch@0324f3d splits/pascal/1_{16,8,4}, splits/cityscapes/1_{16,8,4,2} (CPS's lists; U2PL's are "
           "splits/pascal/u2pl_1_*), training-logs/Pascal-VOC-2012/Blended-Split-Size321, scripts/train.sh 8-16",
           "partition lists (CPS's, UniMatch's main blender and Cityscapes results, instead of U2PL's)",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, needs_lists="cps",
           no_golden="partition list files: no function; "
                     "tests/test_protocol_switches.py::test_augseg_cps_lists_switch_reads_the_cps_lists"),
    Switch("unimatch_epochs", "loop", "schedule.epochs", Derived("UniMatch's own", _publication_epochs),
           Derived("shared", _shared_epochs), "UniMatch@0324f3d configs/cityscapes.yaml 8 (240; VOC: "
           "configs/pascal.yaml 8, 80 as the shared schedule)",
           "Cityscapes: UniMatch's 240 epochs for every head instead of the shared 200",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, datasets=_OWN_EPOCHS,
           no_golden="config and script values: no function; "
                     "tests/test_protocol_switches.py::test_unimatch_switches_set_the_official_evaluation_and_schedule"),
    Switch("unimatch_classifier_dropout", "head", "head.options.dropout", 0.0, 0.1,
           "UniMatch@0324f3d model/semseg/deeplabv3plus.py 29-36, 64-66 (fuse: two 3x3 conv-BN-ReLU, 1x1 classifier; "
           "no dropout)",
           "no dropout in the baseline classifier block (the official fuse and classifier have none) instead of the "
           "shared block's Dropout2d(0.1) twice", "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH,
           heads=("baseline",), golden=_GOLDEN_UNIMATCH_STEPS),
    Switch("unimatch_cutmix_source", "framework", "framework_options.cutmix_source", "second_draw", "batch_shift",
           "UniMatch@0324f3d unimatch.py 121-125 (zip(trainloader_l, trainloader_u, trainloader_u)), 131-145, "
           "fixmatch.py 120-141; LiheYoung/UniMatch issues #51 (the same raw image, another view) and #34 (not "
           "intentional; a shuffled batch does as well)",
           "the CutMix box pastes a second augmentation draw of the same image (its own crop, flip and photometric "
           "draws, predicted in eval mode) instead of another image of the batch",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH, golden=_GOLDEN_UNIMATCH_STEPS),
    Switch("unimatch_lr_timing", "loop", "schedule.lr_timing", "after_step", "before_step",
           "UniMatch@0324f3d unimatch.py 54-56 (SGD at cfg['lr']), 192-208 (the poly LR of iteration i set after "
           "optimizer.step()), fixmatch.py 57-59, 170-184; UniMatch-V2@f6afb4d unimatch_v2.py 206-219, fixmatch.py 207-210",
           "iteration k runs at the poly LR of k - 1 (iteration 0 at the base LR) instead of at lr(k)",
           "[D19](deviations.md#d19-fixmatch-and-unimatch)", frameworks=_UNIMATCH + _UNIMATCH_V2,
           golden=_GOLDEN_UNIMATCH_STEPS),
    Switch("unimatch_v2_projection_head", "head", "head.options.block", "projection", "u2pl",
           "UniMatch-V2@f6afb4d model/semseg/dpt.py 79-83 (output_conv: 3x3 conv, ReLU, 1x1 conv to the classes; "
           "the DPT decoder ends at the ReLU)",
           "the baseline head is the official network's one 1x1 class projection instead of U2PL's classifier block "
           "(two 3x3 conv-BN-ReLU-Dropout(0.1), 1x1), which corrected keeps so that every framework compares the heads "
           "on one block", "[D22](deviations.md#d22-unimatch-v2-and-its-fixmatch)", frameworks=_UNIMATCH_V2,
           heads=("baseline",), golden=_GOLDEN_UNIMATCH_V2_STEPS),
    # ---------------------------------------------------------------- AugSeg / PS-MT classifier, data, shared
    Switch("classifier_dropout", "head", "head.options.dropout", 0.0, 0.1, "AugSeg@7ead870 augseg/models/decoder.py 41-49",
           "dropout in the baseline classifier block",
           "[D12](deviations.md#d12-classifier-dropout)", frameworks=("augseg", "psmt"),
           heads=("baseline",),
           no_golden="a layer's rate in the official decoder: no function; "
                     "tests/test_protocol_switches.py::test_switch_changes_the_training_step"),
    Switch("augseg_cps_lists", "data", "partition_lists", "cps", "u2pl", "AugSeg@7ead870 splitsall.tar.gz",
           "partition lists (CPS's instead of U2PL's)",
           "[D14](deviations.md#d14-augseg-partition-lists)", frameworks=("augseg",), needs_lists="cps",
           no_golden="partition list files: no function; "
                     "tests/test_protocol_switches.py::test_augseg_cps_lists_switch_reads_the_cps_lists"),
    Switch("augseg_cityscapes_aux", "framework", "model.aux_head", False, True,
           "AugSeg@7ead870 Cityscapes configs (aux commented out)",
           "Cityscapes: OHEM without the auxiliary layer-3 head",
           "[D13](deviations.md#d13-augseg-on-cityscapes)", frameworks=("augseg",),
           datasets=_AUX,
           no_golden="config values: no function; "
                     "tests/test_protocol_switches.py::test_augseg_cityscapes_evaluation_window"),
    Switch("augseg_eval_window", "evaluation", "evaluation.crop_size", 800, 769, "AugSeg@7ead870 Cityscapes configs",
           "sliding-window size at evaluation",
           "[D13](deviations.md#d13-augseg-on-cityscapes)", frameworks=("augseg",), datasets=_SLIDING,
           no_golden="config values: no function; "
                     "tests/test_protocol_switches.py::test_augseg_cityscapes_evaluation_window"),
    Switch("augseg_eval_stride", "evaluation", "evaluation.stride", 533,
           Derived("ceil(2/3 x window), derived", lambda values: None), "AugSeg@7ead870 evaluation (stride 2/3 window)",
           "sliding-window stride at evaluation",
           "[D13](deviations.md#d13-augseg-on-cityscapes)", frameworks=("augseg",), datasets=_SLIDING,
           no_golden="config values: no function; "
                     "tests/test_protocol_switches.py::test_augseg_cityscapes_evaluation_window"),
    Switch("augseg_eval_scheme", "evaluation", "evaluation.sliding_scheme", "augseg", "u2pl",
           "AugSeg@7ead870 train_semi.py 537-552 (validate_citys: the loop of UniMatch's evaluate)",
           "Cityscapes sliding windows cut at the border with their probabilities summed, instead of the last "
           "window shifted inside the image and logits averaged",
           "[D13](deviations.md#d13-augseg-on-cityscapes)", frameworks=("augseg",), datasets=_SLIDING,
           no_golden="the same loop as UniMatch's evaluate, line for line (windows, softmax sum, argmax), whose "
                     "golden covers it: tests/test_sliding_eval_golden.py::"
                     "test_released_scheme_reproduces_unimatch_evaluate; the value: "
                     "tests/test_protocol_switches.py::test_augseg_cityscapes_evaluation_window"),
    Switch("align_corners", "model", "model.align_corners", True, False, "every official model (F.interpolate of "
           "the logits to label size; e.g. PS-MT@058cdc3 VocCode/Model/Deeplabv3_plus/encoder_decoder.py 116, "
           "VocCode/train.py 334-337; NP-SemiSeg@afd9672 U2PL/train_semi.py 339)",
           "logits upsampled to label size with align_corners=True (training losses, "
           "pseudo-labels and evaluation)", "[D15](deviations.md#d15-precision-and-upsampling)",
           golden="tests/test_psmt_eval_golden.py::test_released_evaluation_reproduces_psmt_valid_epoch: max "
                  "|difference| 2.4e-7 (PS-MT's evaluation upsampling; False alone moves it by > 1e-3: "
                  "tests/test_psmt_eval_golden.py::test_the_golden_tells_align_corners_apart; training losses not "
                  "compared alone)"),
    Switch("crop_padding", "data", "data.augmentation.crop_padding", "bottom_right", "centered",
           "PS-MT@058cdc3 VocCode/Base/base_dataset.py 60-80 (_crop), AugSeg@7ead870 augseg/dataset/augs_TIBA.py "
           "111-124 (U2PL's Crop, u2pl/dataset/augmentation.py 249-256, pads evenly: not U2PL); UniMatch@0324f3d "
           "dataset/transform.py 9-14",
           "training crops larger than the image padded on the bottom and right only, not evenly",
           "[D18](deviations.md#d18-crop-padding)",
           frameworks=("augseg", "psmt", *_UNIMATCH, *_UNIMATCH_V2),
           golden="tests/test_crop_padding_golden.py::test_released_crop_reproduces_unimatch_crop: max |difference| 0 "
                  "(UniMatch's crop, which UniMatch V2's dataset/transform.py 9-23 repeats; PS-MT's imports cv2, not "
                  "installed; AugSeg's not run)"),
    Switch("crop_fill", "data", "data.augmentation.crop_fill", "zero", "mean",
           "UniMatch@0324f3d dataset/transform.py 13 (ImageOps.expand(img, ..., fill=0)), UniMatch-V2@f6afb4d "
           "dataset/transform.py 13",
           "the image of a training crop larger than it padded with black (the raw image's 0) instead of the ImageNet "
           "mean (zero after normalisation, as U2PL, PS-MT and AugSeg pad)",
           "[D18](deviations.md#d18-crop-padding)", frameworks=(*_UNIMATCH, *_UNIMATCH_V2),
           golden="tests/test_crop_padding_golden.py::test_released_crop_reproduces_unimatch_crop: max |difference| 0 "
                  "(UniMatch's crop: labels and image, its fill included)"),
    Switch("official_data_order", "data", "data.order",
           Derived("the official scripts' (U2PL, AugSeg shared_sampled; the UniMatch family shared_repeated; "
                   "MT shared_repeated_frozen; PS-MT cycled_labeled)",
                   lambda values: _official_data_order(values)), "passes",
           "UniMatch@0324f3d dataset/semi.py 25-27 (the labeled ids repeated and truncated), unimatch.py 80-88, "
           "118-119 and fixmatch.py 80-88, 117-118 (a DistributedSampler of seed 0 per list, set_epoch); "
           "UniMatch-V2@f6afb4d unimatch_v2.py 106-119, 156-157; U2PL@ab3d2be u2pl/dataset/pascal_voc.py 24-31 "
           "(random.seed(seed); random.sample of the list repeated), 136, 147, train_semi.py 254-255; AugSeg@7ead870 "
           "augseg/dataset/pascal_voc.py 41-46, 173, 180, train_semi.py 269-270; NP-SemiSeg@afd9672 "
           "U2PL/train_semi.py 285-286, AugSeg/train_semi.py 290-291; TorchSemiSeg@5e0c29c "
           "exp.voc/voc8.res50v3+.MeanTeacher/dataloader.py 71-100, train.py 143-145 (set_epoch of the labeled "
           "sampler only), furnace/datasets/BaseDataset.py 102-117 (the labeled list repeated to max_samples); PS-MT@058cdc3 "
           "VocCode/train.py 196 (zip(cycle(supervised_loader), unsupervised_loader)), 142 (the warm-up's own pass), "
           "DataLoader/voc.py 63-81, Base/base_dataloader.py 7-24 (a shuffled loader without a sampler on one GPU)",
           "both lists read in one permutation per epoch (seed 0 + epoch, whatever the run's seed), the labeled list "
           "repeated to the unlabeled list's length (UniMatch's, TorchSemiSeg's) or drawn once per run from its "
           "copies, the unlabeled list shuffled once (U2PL's, AugSeg's): each unlabeled image meets the same labeled "
           "image every epoch (TorchSemiSeg's unlabeled images come in epoch 0's order in every epoch, their labeled "
           "partners change), and a labeled image may come twice in a batch; PS-MT's streams are shuffled on their "
           "own, but after the warm-up its labeled stream replays the epoch's first pass, the same batches with the "
           "same augmentations, through the epoch; instead of streams shuffled on their own in passes",
           "[D24](deviations.md#d24-data-order)",
           frameworks=("u2pl", "augseg", *_MT, "psmt", *_UNIMATCH, *_UNIMATCH_V2),
           no_golden="the samplers are torch's DistributedSampler over the official lists, no function of the "
                     "scripts: tests/test_training.py::test_shared_data_order_is_the_official_samplers_order"),
    Switch("grad_clip_per_head", "loop", "optim.grad_clip",
           Derived("the head's (NP 5.0, others none)", lambda values: _head_grad_clip(values)), 5.0,
           "NP-SemiSeg@afd9672 U2PL/train_semi.py 625, AugSeg/train_semi.py 448 (clip_grad_norm_ at 5 in the NP "
           "trainers); U2PL@ab3d2be, AugSeg@7ead870, PS-MT@058cdc3, TorchSemiSeg@5e0c29c trainers (no clipping)",
           "gradient-norm clipping at 5 for NP cells only (the authors' NP scripts) instead of at 5 for every head, "
           "so that a baseline-vs-NP difference does not mix the head with the clipping",
           "[D20](deviations.md#d20-gradient-clipping-by-head)",
           no_golden="one line of each trainer: no function; "
                     "tests/test_protocol_switches.py::test_grad_clip_per_head_switch_clips_every_head_alike_under_corrected"),
    Switch("head_settings", "loop", "schedule.head_settings", "per_head", "shared",
           "each framework's configs (the datasets' PaperSettings.publications, npsemiseg/data/sets/pascal.py and "
           "cityscapes.py, with their sources: "
           "PS-MT@058cdc3 VocCode/main.py 194-200 LR 2.5e-3 x 4 GPUs, CityCode config 4.5e-3; TorchSemiSeg@5e0c29c "
           "MeanTeacher config.py 102, 34 epochs); NP-SemiSeg@afd9672 "
           "AugSeg/exps/zrun_vocs/r50_voc_semi732/config_semi.yaml 9 (PaperSettings.np_configs)",
           "baseline rows at each framework's own full crops and batches, LR and epochs, MC dropout and NP at "
           "the NP configs' 480/580 and 12/8 (AugSeg VOC 8) (released); one setting for all heads of a framework "
           "(corrected)", "[P](deviations.md#provenance-of-the-papers-rows)",
           no_golden="values of the official configs: no function; "
                     "tests/test_presets_audit.py::test_audit_row_matches_the_preset"),
)

#: whole-step goldens (issue: every framework's step equals its official loop under ``released``): framework, the
#: official loop body run, the test, and what it compares with its largest |difference|
STEP_GOLDENS: tuple[tuple[str, str, str, str], ...] = (
    ('psmt',
     'PS-MT@058cdc3 VocCode/train.py 189-311 (Trainer._train_epoch, one iteration), EntireModel.py 55-100',
     'tests/test_psmt_step_golden.py::test_one_released_step_matches_the_official_step',
     'max |difference| 5.4e-7 relative (gradients; every parameter and BN buffer of student and both teachers'
     " 1.3e-7, losses 2.3e-8, teachers' logits 4.4e-8, LR 0; float64 networks, float32 losses) on every CPU "
     "kernel path; not compared: the teachers' num_batches_tracked (never read)"),
    ('mt_cps',
     'TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher network.py 25-47 (run), train.py 90-123, 177-215'
     ' (the step written out around it, the official group_weight and WarmUpPolyLR run)',
     'tests/test_mt_cps_golden.py::test_one_released_step_matches_the_official_step',
     "float64 on both sides (the project's loss path float32 by design); worst over the CPU kernel paths: "
     "losses 6.3e-8, LR 0, teacher's probabilities 4.5e-8 (stored in float32); every student gradient 6.8e-7 "
     "(relative to its tensor's largest entry); every parameter and BN buffer of student and teacher 5.5e-9 "
     '(relative to max(1, max |x|))'),
    ('supervised',
     'U2PL@ab3d2be train_sup.py 177-251 (train(), one iteration), 97-134 (optimiser, scheduler), '
     'u2pl/utils/loss_helper.py 238-360 (criterion)',
     'tests/test_supervised_step_golden.py::test_one_released_step_matches_the_official_step',
     'VOC (CE) and Cityscapes (OHEM + 0.4 aux) cells, float64 network on both sides (float32 losses): loss '
     "7.5e-8, LR 0; every gradient 1.0e-6 (relative to its tensor's largest entry); every parameter and BN "
     'buffer 6.5e-8 (relative to max(1, max |x|)); the same on AVX-512, AVX2 and SSE kernel paths'),
    ('u2pl',
     'U2PL@ab3d2be train_semi.py train(), one iteration (backward, SGD, EMA 543-548; teacher reset 309-315)',
     'tests/test_u2pl_step_golden.py::test_one_released_step_matches_the_official_iteration',
     'float64 networks on both sides (float32 losses and memory bank): max |difference| 3.4e-7 relative to '
     "each gradient's scale (losses 1.2e-7, parameters 2.8e-8, BN buffers 1e-14, memory bank 0; the largest "
     'over AVX-512, AVX2 and SSE kernel paths), a supervised-only step, the first semi-supervised epoch and a'
     ' later one'),
    ('u2pl',
     'head np: NP-SemiSeg@afd9672 U2PL/train_semi.py train(), one iteration (clipping, SGD, EMA; 357-363), '
     'model_helper.py 78, decoder.py 124-134',
     'tests/test_np_u2pl_step_golden.py::test_one_released_step_matches_the_authors_iteration',
     "float64 networks on both sides: max |difference| 1.6e-6 relative to each gradient's scale after the "
     "clipping (the NP query network's, back through the float32 attention, 2.7e-5; losses 1.1e-7, parameters"
     ' 7.2e-9, NP centers 6.3e-9, memory bank 5.4e-9, BN buffers 1e-14; the largest over AVX-512, AVX2 and '
     'SSE kernel paths), a supervised-only step, the first semi-supervised epoch and a later one'),
    ('augseg',
     'AugSeg@7ead870 train_semi.py train(), one iteration',
     'tests/test_augseg_step_golden.py::test_one_released_step_matches_the_official_iteration',
     "float64 on both sides (the project's loss path float32 by design); worst over the CPU kernel paths: max"
     " |difference| 2.1e-6 relative (gradients, to their tensor's scale; losses 8.1e-8, parameters 2.4e-8, BN"
     " buffers 2.1e-15; the teacher's num_batches_tracked not compared), epoch 0 and epoch 1"),
    ('augseg',
     'head np: NP-SemiSeg@afd9672 AugSeg/train_semi.py train(), two iterations, model_helper.py 50, 109-111',
     'tests/test_np_augseg_step_golden.py::test_two_released_steps_match_the_authors_iterations',
     "two steps, float64 on both sides (the project's loss path and NP attention, samples and memories "
     "float32 by design); worst over the CPU kernel paths: the second step's gradients 2.9e-5 of their "
     "tensor's scale; NP centers 8.0e-8, BN buffers 4.8e-8, losses 2.7e-8, parameters 1.2e-8 relative"),
    ('fixmatch',
     'UniMatch@0324f3d fixmatch.py loop body, one iteration (model/semseg/deeplabv3plus.py)',
     'tests/test_fixmatch_step_golden.py::test_one_released_step_matches_the_official_step',
     'max |difference| 5.7e-7 relative (VOC settings 3.6e-7, Cityscapes 5.7e-7; every loss, the mask ratio, '
     'the LR, every gradient, parameter and BN buffer; float64 network, float32 losses)'),
    ('unimatch',
     'UniMatch@0324f3d unimatch.py 127-220, one iteration (model/semseg/deeplabv3plus.py 38-68)',
     'tests/test_unimatch_step_golden.py::test_one_released_step_matches_the_official_step',
     'max |difference| 4.5e-7 relative (VOC settings 3.2e-7, Cityscapes 4.5e-7; every loss, the mask ratio, '
     'the LR, every gradient, parameter and BN buffer; float64 network, float32 losses)'),
    ('unimatch_v2',
     'UniMatch-V2@f6afb4d unimatch_v2.py loop body, one iteration (AdamW step, EMA), model/semseg/dpt.py',
     'tests/test_unimatch_v2_golden.py::test_gradients_the_adamw_step_and_the_ema_teacher_equal_the_official_step',
     "the data pipeline's batch (two strong views, a padded crop, the project's box draws) and the released "
     "baseline head (the official 1x1 projection); worst over the CPU kernel paths: max |difference| 1.1e-6 "
     "relative (gradient sums; losses 2.6e-8, teacher confidences 1.1e-7, gradient entries 5.9e-8, parameters "
     "after AdamW 5.2e-9 (entries with a gradient above 1e-6; sums over those above 1e-5: 9.6e-10); float64 "
     "networks, float32 losses); tiny ViT + DPT"),
    ('fixmatch_v2',
     'UniMatch-V2@f6afb4d fixmatch.py loop body, one iteration (AdamW step, EMA), model/semseg/dpt.py',
     'tests/test_unimatch_v2_golden.py::test_gradients_the_adamw_step_and_the_ema_teacher_equal_the_official_step',
     "max |difference| 9.8e-7 relative (gradient sums; losses 9.2e-9, parameters after AdamW 2.2e-8; compared as "
     "unimatch_v2's, on the same batch; float64 networks, float32 losses); tiny ViT + DPT"),
)


#: every switch by name (the one table)
SWITCHES: dict[str, Switch] = {switch.name: switch for switch in _SWITCH_LIST}


def check_protocol(protocol: str) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS`, else ``ValueError`` naming it."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: unknown name {protocol!r}, expected one of {list(PROTOCOLS)}")
    return protocol


def get_switch(name: str) -> Switch:
    """The switch ``name`` (or its earlier name: ``npsemiseg.renames``); ``ValueError`` listing the switches for an
    unknown name."""
    name = current_key(f"{SWITCH_PREFIX}{name}").removeprefix(SWITCH_PREFIX)
    if name not in SWITCHES:
        raise ValueError(f"switch: unknown name {name!r}, expected one of {sorted(SWITCHES)}")
    return SWITCHES[name]


def implemented_switches() -> tuple[Switch, ...]:
    """The switches that set a configuration field (the others are rows still to do)."""
    return tuple(switch for switch in _SWITCH_LIST if switch.target is not None)


def protocol_switches(protocol: str, *, framework: str, dataset: str, head: str,
                      values: dict[str, Any] | None = None) -> list[tuple[Switch, Any]]:
    """Every implemented switch applying to the cell with its value under ``protocol``, in table order
    (``values``: the cell's nested configuration values, for derived values). A switch that chooses the framework
    class is not among them: :func:`protocol_framework` applies it before the framework's settings are known."""
    check_protocol(protocol)
    return [(s, s.value(protocol, values)) for s in _SWITCH_LIST if s.target != FRAMEWORK_TARGET
            and s.applies(framework=framework, dataset=dataset, head=head)]


def framework_switches() -> tuple[Switch, ...]:
    """The switches whose target is the framework class (``mt_framework``)."""
    return tuple(switch for switch in _SWITCH_LIST if switch.target == FRAMEWORK_TARGET)


def protocol_framework(protocol: str, framework: str, dataset: str, head: str) -> tuple[str, Switch | None]:
    """The framework class a cell asked for as ``framework`` runs under ``protocol``, and the switch that chose it
    (None: the class asked for, no switch concerns it).

    A switch whose target is ``framework`` chooses between its released and corrected classes for the cells asked
    for by its corrected one, the paper done right (``mt_framework``: a cell asked as ``mt`` runs ``mt_cps`` under
    ``released``, ``mt`` under ``corrected``); a cell asked for by another name (``mt_cps``) runs that class
    under either protocol. The cell keeps the name asked for as its label (``framework_label``)."""
    check_protocol(protocol)
    for switch in framework_switches():
        if framework == switch.corrected and switch.applies(framework=framework, dataset=dataset, head=head):
            return switch.value(protocol), switch
    return framework, None


def protocol_overrides(protocol: str, *, framework: str, dataset: str, head: str,
                       values: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{target: value}`` of every implemented switch applying to the cell under ``protocol``."""
    return {switch.target: value for switch, value in protocol_switches(protocol, framework=framework, dataset=dataset,
                                                                        head=head, values=values)}


def switch_target(key: str) -> str:
    """The configuration key behind ``switches.<name>`` (``ValueError`` for an unknown or unimplemented one)."""
    switch = get_switch(key.removeprefix(SWITCH_PREFIX))
    if switch.target is None:
        raise ValueError(f"switch {switch.name!r} is not implemented yet (rows {switch.rows}); see docs/PROTOCOL.md")
    return switch.target


def switch_values(values: dict[str, Any]) -> dict[str, Any]:
    """Every switch's value in the configuration ``values`` (a RunConfig's JSON dump), ``n/a`` where it does not apply."""
    out: dict[str, Any] = {}
    for switch in _SWITCH_LIST:
        applies = switch.applies(framework=values["framework"], dataset=values["dataset"], head=values["head"]["name"])
        out[switch.name] = _read(values, switch.target) if applies else NOT_APPLICABLE
    return out


def _read(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def protocol_markdown() -> str:
    """``docs/PROTOCOL.md``: the table of switches as Markdown (the test compares the file with this)."""
    lines = [
        "# The two protocols: `released` and `corrected`",
        "",
        "Generated from `npsemiseg/protocol.py` (`python -m npsemiseg.protocol > docs/PROTOCOL.md`); a test fails",
        "when this file and the table disagree. `protocol: released` reproduces the code behind the paper's",
        "numbers; `protocol: corrected` is the paper done right. Set one switch on its own with",
        "`switches.<name>=<value>` (or its configuration key); it wins over the protocol.",
        "A switch whose key is `framework` chooses the framework class of the cells asked for by its corrected",
        "value (`mt`), before their settings are composed; set it by name only (`framework=<name>` asks for a cell,",
        "to which the protocol applies; `mt_cps` asked for by name runs under either protocol).",
        "A switch whose key is `-` is a known difference that no configuration field selects yet.",
        "The official sources are `repository@commit path lines`; [deviations.md](deviations.md) names the",
        "repositories and describes each difference (column `details`).",
        "Column `golden`: the test that runs the official function and ours on the same inputs with the released",
        "value, and the largest \\|difference\\| it records; or `none:`, why no such comparison exists and which",
        "test checks the value instead.",
        "",
        "| switch | owner | key | released | corrected | applies to | official source | what it changes | details | golden |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in _SWITCH_LIST:
        scope = ", ".join(part for part in (
            "frameworks " + "/".join(s.frameworks) if s.frameworks else "",
            "heads " + "/".join(s.heads) if s.heads else "",
            f"datasets with {s.needs_lists} lists" if s.needs_lists else "",
            s.datasets.text if s.datasets else "",
        ) if part) or "all"
        key = f"`{s.target}`" if s.target else "-"
        lines.append(f"| `{s.name}` | {s.owner} | {key} | `{s.released!r}` | `{s.corrected!r}` | {scope} | "
                     f"{s.source} | {s.changes} | {s.rows} | {_evidence(s)} |")
    lines += ["", "## Whole-step goldens", "",
              "One training step of `npsemiseg.training.step.train_step` under `released` against one iteration of the",
              "official loop body (imported from the official checkout by the recorder, on the project's small network",
              "with the same weights and random draws), and the largest \\|difference\\| each records.", "",
              "| framework | official loop body | test | compared, max \\|difference\\| |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {source} | `{test}` | {text.replace('|', chr(92) + '|')} |"
              for name, source, test, text in STEP_GOLDENS]
    return "\n".join(lines) + "\n"


def _evidence(switch: Switch) -> str:
    """The ``golden`` column: the golden test and its max |difference|, or ``none:`` and the reason (test ids as
    code, ``|`` escaped for the table)."""
    text = switch.golden or f"none: {switch.no_golden}"
    return TEST_ID.sub(lambda m: f"`{m.group(0)}`", text).replace("|", "\\|")


if __name__ == "__main__":
    print(protocol_markdown(), end="")

"""``data.unlabeled_truth``: the unlabeled images' labels revealed for the pseudo-label diagnostics
(``measured``: the teacher's accuracy logged; ``oracle``: the truth in the teacher's place)."""

from __future__ import annotations

import pytest
import torch

from unlabeled_views import with_unimatch_views
from npsemiseg.config import with_overrides
from npsemiseg.data import build_dataset
from npsemiseg.data.partitions import partition_ids
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks.pseudo_labels import TeacherPrediction, oracle_prediction, prediction_from_logits
from npsemiseg.training import build_framework
from tests.data_fixtures import make_voc_tree

SSL_FRAMEWORKS = ("mt", "psmt", "u2pl", "augseg", "fixmatch")
TRUE_CLASS = 3


@pytest.mark.parametrize("dataset", ["synthetic", "study"])
def test_procedural_unlabeled_split_reveals_its_labels_only_when_asked(dataset):
    options = {"train_size": 64} if dataset == "study" else {}
    hidden = build_dataset(dataset, "unlabeled", partition="1/16", max_items=3, **options)
    shown = build_dataset(dataset, "unlabeled", partition="1/16", max_items=3, reveal_labels=True, **options)
    assert hidden.ids == shown.ids
    for i in range(3):
        assert bool((hidden[i]["label"] == 255).all())
        assert torch.equal(hidden[i]["image"], shown[i]["image"])
        label = shown[i]["label"]
        assert bool((label != 255).any()) and int(label[label != 255].max()) < hidden.info.num_classes


def test_voc_unlabeled_split_reads_its_label_files_when_revealed(tmp_path):
    ids = partition_ids("pascal_blender", "unlabeled", "662")[:3]
    written = make_voc_tree(tmp_path, ids)
    hidden = build_dataset("pascal_blender", "unlabeled", tmp_path, "1/16", max_items=3)
    shown = build_dataset("pascal_blender", "unlabeled", tmp_path, "1/16", max_items=3, reveal_labels=True)
    for i, image_id in enumerate(ids):
        assert bool((hidden[i]["label"] == 255).all())
        assert shown[i]["label"].numpy().tolist() == written[image_id].tolist()


def test_oracle_prediction_is_the_truth_where_known_and_the_teacher_elsewhere():
    torch.manual_seed(0)
    teacher = prediction_from_logits(torch.randn(1, 2, 4, 3, 3), (3, 3))
    truth = torch.randint(0, 4, (2, 3, 3))
    truth[0, 0, :] = 255
    oracle = oracle_prediction(teacher, truth)
    known = truth != 255
    assert torch.equal(oracle.label[known], truth[known])
    assert torch.equal(oracle.label[~known], teacher.label[~known])
    assert torch.allclose(oracle.confidence[known], torch.ones(int(known.sum())))
    assert torch.equal(oracle.entropy[known], torch.zeros(int(known.sum())))
    assert torch.equal(oracle.probs[0, :, 0], teacher.probs[0, :, 0])
    assert torch.equal(oracle.log_probs().argmax(dim=1), oracle.label)  # PS-MT combines teachers' log-probs


def _batch(config, *, batch: int = 2) -> Batch:
    """Labeled and unlabeled images whose every pixel is class ``TRUE_CLASS`` (so every pseudo-label the
    student may be given under the oracle, CutMix boxes of labeled images included, is that class)."""
    gen = torch.Generator().manual_seed(0)
    size = config.schedule.crop_size
    truth = torch.full((batch, size, size), TRUE_CLASS)
    labeled = {"image": torch.rand(batch, 3, size, size, generator=gen), "label": truth.clone()}
    labeled["image_strong"] = (labeled["image"] * 0.8).clamp(0, 1)
    unlabeled = {"image": torch.rand(batch, 3, size, size, generator=gen), "label": truth.clone()}
    unlabeled["image_strong"] = unlabeled["image"].flip(-1)
    return Batch(labeled=labeled, unlabeled=with_unimatch_views(unlabeled))


def _student_labels(smoke_config, framework: str, truth: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The pseudo-labels one step of ``framework`` hands the student (``labels_u`` of its student pass: PS-MT's
    perturbed one) and the step's logs."""
    options = {"queue_size": 16, "background_queue_size": 16} if framework == "u2pl" else {}
    config = with_overrides(smoke_config(framework=framework, framework_options=options),
        {"data.unlabeled_truth": truth})
    torch.manual_seed(0)
    fw = build_framework(config)
    seen = []
    name = "_perturbed_pass" if framework == "psmt" else "student_pass"
    student_pass = getattr(fw, name)

    def recording_pass(images_l, labels_l, images_u, labels_u, *rest):
        seen.append(labels_u.clone())
        return student_pass(images_l, labels_l, images_u, labels_u, *rest)

    setattr(fw, name, recording_pass)
    ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
    result = fw.train_step(_batch(config), ctx)
    return seen[0], result.logs


@pytest.mark.parametrize("framework", SSL_FRAMEWORKS)
def test_oracle_hands_the_student_the_truth_and_measured_leaves_the_teacher(smoke_config, framework):
    oracle, oracle_logs = _student_labels(smoke_config, framework, "oracle")
    kept = oracle != 255
    assert bool(kept.any()) and bool((oracle[kept] == TRUE_CLASS).all())
    measured, measured_logs = _student_labels(smoke_config, framework, "measured")
    hidden, hidden_logs = _student_labels(smoke_config, framework, "hidden")
    assert torch.equal(measured, hidden)  # measuring changes nothing the student sees
    assert not torch.equal(hidden, oracle)  # a random-init teacher is not the truth
    assert "pseudo_label_accuracy" not in hidden_logs and "pseudo_label_class_accuracy" not in hidden_logs
    # the accuracy logged is the real teacher's, with or without the oracle
    assert 0.0 <= measured_logs["pseudo_label_accuracy"] < 1.0
    assert oracle_logs["pseudo_label_accuracy"] == pytest.approx(measured_logs["pseudo_label_accuracy"])


def test_measured_accuracy_is_the_share_of_right_pseudo_labels(smoke_config):
    config = with_overrides(smoke_config(framework="mt"), {"data.unlabeled_truth": "measured"})
    torch.manual_seed(0)
    fw = build_framework(config)
    batch = _batch(config)
    teacher: TeacherPrediction = fw.predict(fw.teacher, batch.unlabeled["image"])
    truth = teacher.label.clone()
    truth[0] = (truth[0] + 1) % config.num_classes  # image 0 all wrong, image 1 all right
    truth[1, 0] = 255  # not counted
    fw.predict_unlabeled(fw.teacher, {**batch.unlabeled, "label": truth})
    known = truth != 255
    logs = fw.step_logs(fw.labeled_pass(batch.labeled["image"], batch.labeled["label"]))
    assert logs["pseudo_label_accuracy"] == pytest.approx(known[1].sum().item() / known.sum().item())
    per_class = [((truth[1] == c).sum() / (truth[known] == c).sum()).item() for c in truth[known].unique()]
    assert logs["pseudo_label_class_accuracy"] == pytest.approx(sum(per_class) / len(per_class))
    for c, recall in zip(truth[known].unique().tolist(), per_class):
        assert logs[f"pseudo_label_recall/{c}"] == pytest.approx(recall)
    for c in teacher.label[known].unique().tolist():  # of the pixels labelled c, those of image 1 are right
        labelled = (teacher.label == c) & known
        assert logs[f"pseudo_label_precision/{c}"] == pytest.approx(labelled[1].sum().item() / labelled.sum().item())
    assert "pseudo_label_accuracy" not in fw.step_logs(fw.labeled_pass(batch.labeled["image"], batch.labeled["label"]))
    # the run's confusion: image 1 on the diagonal, image 0 one class off; a second step adds to it
    confusion = fw.pseudo_label_confusion.clone()
    assert confusion.sum().item() == known.sum().item()
    assert confusion.diagonal().sum().item() == known[1].sum().item()
    assert confusion[(teacher.label[0, 0, 0] + 1) % config.num_classes, teacher.label[0, 0, 0]].item() > 0
    fw.predict_unlabeled(fw.teacher, {**batch.unlabeled, "label": truth})
    assert torch.equal(fw.pseudo_label_confusion, 2 * confusion)


def test_truth_diagnostics_refuse_what_they_cannot_measure(smoke_config):
    with pytest.raises(ValueError, match="supervised framework uses no unlabeled"):
        build_framework(with_overrides(smoke_config(), {"data.unlabeled_truth": "oracle"}))
    with pytest.raises(ValueError, match="mt_cps framework has no pseudo-labels"):
        build_framework(with_overrides(smoke_config(framework="mt_cps"), {"data.unlabeled_truth": "oracle"}))
    config = with_overrides(smoke_config(framework="mt"), {"data.unlabeled_truth": "measured"})
    fw = build_framework(config)
    batch = _batch(config)
    with pytest.raises(ValueError, match="carry no labels"):
        fw.predict_unlabeled(fw.teacher, {**batch.unlabeled, "label": torch.full_like(batch.unlabeled["label"], 255)})

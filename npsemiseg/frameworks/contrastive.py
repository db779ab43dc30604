"""U2PL's contrastive loss with per-class queues of negative keys (``docs/frameworks.md``, U2PL).

For every class c present in the batch:

- anchors: student embeddings of reliable pixels of class c (labeled pixels with GT c;
  unlabeled pixels with low-entropy pseudo-label c) whose teacher probability of c
  exceeds ``anchor_threshold`` (0.3); ``num_queries`` (256) sampled with replacement;
- positive: the mean teacher embedding of the reliable pixels of class c;
- negatives: ``num_negatives`` (50) per anchor sampled from the class-c queue of teacher
  embeddings. Candidates enqueued this step (before sampling): labeled pixels whose GT is
  not c but c is among the teacher's top ``low_rank`` (3) classes; unreliable
  (high-entropy) unlabeled pixels where c ranks in ``[low_rank, high_rank)`` (3..19).

InfoNCE on cosine similarity with temperature 0.5, averaged over the classes present.

This follows the paper's definition. The released code differs in three ways, reproduced when
asked (``released_bugs``, the ``protocol: released`` switches): (0) its ``label_onehot`` gives
labels to the first labeled and first unlabeled image only (:func:`class_membership`), and with
``label_onehot_ignored`` the ignored pixels of every image count as class 0 there unless the first
image ignores that pixel itself; (1) its
labeled negative mask requires GT == c and GT != c at once, so labeled pixels never become
negatives (U2PL issue #171), and its unlabeled negatives also require pseudo-label == c; (2) it
indexes anchors and prototypes by the position in the list of present classes rather than by
class (issue #111).

Queues are held by :class:`ClassQueues` and saved in the framework's ``state_dict``, so a
resumed run continues exactly; keys are gathered across DDP ranks
before enqueueing so every rank holds the same queues.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def all_gather_rows(rows: Tensor) -> Tensor:
    """Concatenate ``rows [n_r, E]`` of every rank (variable ``n_r``), rank order; identity
    when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rows
    world = dist.get_world_size()
    count = torch.tensor([rows.shape[0]], device=rows.device, dtype=torch.long)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    longest = max(sizes)
    padded = rows.new_zeros((longest, rows.shape[1]))
    padded[: rows.shape[0]] = rows
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)], dim=0)


class ClassQueues:
    """FIFO queues of ``dim``-d keys, one per class, with per-class capacities ``sizes``.

    Each queue grows as keys arrive (as U2PL's lists do) up to its capacity, then
    overwrites its oldest rows (ring buffer), so memory is proportional to what was
    enqueued, not to the paper's 30000/50000 capacities. ``state_dict()`` /
    ``load_state_dict()`` hold the keys and write pointers for exact resume.
    """

    def __init__(self, sizes: Sequence[int], dim: int) -> None:
        if not sizes or any(int(s) <= 0 for s in sizes):
            raise ValueError(f"sizes: expected positive queue sizes per class, got {list(sizes)}")
        if dim <= 0:
            raise ValueError(f"dim: expected > 0, got {dim}")
        self.sizes = [int(s) for s in sizes]
        self.dim = dim
        self.keys: list[Tensor] = [torch.zeros(0, dim) for _ in self.sizes]
        self.pointer = [0 for _ in self.sizes]

    @property
    def num_classes(self) -> int:
        return len(self.sizes)

    @torch.no_grad()
    def enqueue(self, cls: int, keys: Tensor) -> None:
        """Append ``keys [n, dim]`` to class ``cls``'s queue, dropping the oldest beyond capacity."""
        size = self.sizes[cls]
        keys = keys.detach().float()[-size:]
        n = keys.shape[0]
        if n == 0:
            return
        queue = self.keys[cls].to(keys.device)
        free = size - queue.shape[0]
        if free > 0:  # still growing: append (pointer stays 0 until full)
            queue = torch.cat([queue, keys[:free]], dim=0)
            keys = keys[free:]
            n = keys.shape[0]
        if n > 0:  # full: overwrite the oldest rows, starting at the pointer
            start = self.pointer[cls]
            positions = (start + torch.arange(n, device=keys.device)) % size
            queue[positions] = keys
            self.pointer[cls] = (start + n) % size
        self.keys[cls] = queue

    def class_keys(self, cls: int) -> Tensor:
        """The filled rows of class ``cls``'s queue, ``[n, dim]``, the oldest first: U2PL's list order (it appends and
        keeps the last rows), so that the same drawn indices pick the same negatives (a full ring buffer holds its
        oldest row at the pointer)."""
        keys, start = self.keys[cls], self.pointer[cls]
        return torch.roll(keys, -start, dims=0) if start else keys

    def state_dict(self) -> dict[str, Tensor]:
        state = {f"keys.{c}": k.detach().cpu().clone() for c, k in enumerate(self.keys)}
        state["pointer"] = torch.tensor(self.pointer, dtype=torch.long)
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        expected = {f"keys.{c}" for c in range(self.num_classes)} | {"pointer"}
        if set(state) != expected:
            raise ValueError(f"queue state: expected keys {sorted(expected)}, got {sorted(state)}")
        for c in range(self.num_classes):
            keys = state[f"keys.{c}"]
            if keys.dim() != 2 or keys.shape[1] != self.dim or keys.shape[0] > self.sizes[c]:
                raise ValueError(
                    f"queue state: keys.{c} has shape {tuple(keys.shape)}, expected [<= {self.sizes[c]}, {self.dim}]"
                )
            self.keys[c] = keys.float().clone()
        self.pointer = [int(p) for p in state["pointer"].tolist()]


#: the released code's bugs ``contrastive_loss`` can reproduce (``released_bugs``; U2PL utils.py 50-59,
#: loss_helper.py 127-140 and 173-188; ``docs/deviations.md`` D3)
U2PL_BUGS = ("label_onehot", "label_onehot_ignored", "labeled_negatives", "prototype_index")


def class_membership(labels: Tensor, num_labeled: int, num_classes: int, *, onehot_bug: bool = False,
                     ignored_as_background: bool = False, ignore_index: int = 255) -> Tensor:
    """``[B, K, h, w]`` bool: pixel of image b belongs to class c (``labels [B, h, w]``, labeled images first).

    ``onehot_bug``: the released ``label_onehot`` scatters over the batch dimension, so only the first
    labeled and the first unlabeled image hold labels, each the union over its part of the batch (multi-hot);
    the other images belong to no class. Ignored pixels are left out of the union.

    ``ignored_as_background`` (with ``onehot_bug``; no effect without it): as the released ``label_onehot``
    (U2PL utils.py 54-57) the ignored pixels are set to class 0 before the scatter, so every ignored pixel of
    any image of the part adds class 0 at its position in the first image's slot; the clearing that follows
    (``outputs[:, inputs == 255] = 0``) clears each image's own slot only, so the first image's slot loses
    the positions that the first image itself ignores (every class there) and nothing else.
    """
    valid = labels != ignore_index
    member = F.one_hot(torch.where(valid, labels, 0), num_classes).permute(0, 3, 1, 2).bool()
    if not (onehot_bug and ignored_as_background):
        member = member & valid[:, None]
    if not onehot_bug:
        return member
    scrambled = torch.zeros_like(member)
    for first, part in ((0, slice(0, num_labeled)), (num_labeled, slice(num_labeled, None))):
        if member[part].shape[0]:
            scrambled[first] = member[part].any(dim=0)
            if ignored_as_background:
                scrambled[first] &= valid[first]
    return scrambled


def contrastive_loss(
    rep_student: Tensor,
    rep_teacher: Tensor,
    prob_teacher: Tensor,
    labels: Tensor,
    reliable: Tensor,
    unreliable: Tensor,
    num_labeled: int,
    queues: ClassQueues,
    *,
    anchor_threshold: float = 0.3,
    low_rank: int = 3,
    high_rank: int = 20,
    temperature: float = 0.5,
    num_queries: int = 256,
    num_negatives: int = 50,
    ignore_index: int = 255,
    generator: torch.Generator | None = None,
    released_bugs: Sequence[str] = (),
) -> tuple[Tensor, dict[str, float | Tensor]]:
    """U2PL's contrastive loss; enqueues this batch's negative keys first.

    rep_student, rep_teacher: ``[B, E, h, w]`` embeddings (labeled images first);
    prob_teacher ``[B, K, h, w]``; labels ``[B, h, w]`` (GT for the first ``num_labeled``,
    pseudo-labels after that, ``ignore_index`` where invalid); reliable / unreliable
    ``[B, h, w]`` bool (for labeled images: every valid pixel). Returns the scalar loss
    (0 connected to the graph when fewer than two classes are present) and logs: ``contrastive_classes`` (present),
    and where a class has anchors and negatives, ``contrastive_fewest_anchors`` (the smallest anchor count of a
    class) and ``contrastive_anchor_norm_min`` (the smallest anchor norm).
    ``released_bugs``: any of :data:`U2PL_BUGS` to reproduce the released code.
    """
    _check_inputs(rep_student, rep_teacher, prob_teacher, labels, queues, released_bugs)
    student = rep_student.permute(0, 2, 3, 1).float()  # [B, h, w, E]
    teacher = rep_teacher.detach().permute(0, 2, 3, 1).float()
    prob = prob_teacher.detach().float()
    member = class_membership(labels, num_labeled, prob.shape[1], onehot_bug="label_onehot" in released_bugs,
                              ignored_as_background="label_onehot_ignored" in released_bugs, ignore_index=ignore_index)
    _enqueue_negatives(teacher, prob, member, unreliable, num_labeled, queues, low_rank, high_rank,
                       bugged="labeled_negatives" in released_bugs)
    has_reliable = (reliable[:, None] & member).flatten(2).any(dim=2).any(dim=0).tolist()  # [K], one read
    present = [c for c in range(prob.shape[1]) if has_reliable[c]]
    logs = {"contrastive_classes": float(len(present))}
    if len(present) <= 1:
        return rep_student.sum() * 0.0, logs
    losses, used_anchors = [], []  # (Tensors) the InfoNCE loss of each class with anchors; its anchors
    for position, c in enumerate(present):
        # the released code takes anchors and positive of the class at this *position*, negatives of class c
        source = position if "prototype_index" in released_bugs else c
        reliable_c = reliable & member[:, source]
        anchors = student[reliable_c & (prob[:, source] > anchor_threshold)]
        negatives = queues.class_keys(c)
        if anchors.shape[0] == 0 or negatives.shape[0] == 0 or not has_reliable[source]:
            continue
        used_anchors.append(anchors.detach())
        losses.append(_infonce(anchors, teacher[reliable_c].mean(dim=0), negatives, num_queries=num_queries,
                               num_negatives=num_negatives, temperature=temperature, generator=generator))
    if not losses:
        return rep_student.sum() * 0.0, logs
    logs.update(_anchor_logs(used_anchors))
    return torch.stack(losses).sum() / len(present), logs


def _anchor_logs(anchor_sets: Sequence[Tensor]) -> dict[str, float | Tensor]:
    """The fewest anchors of a class and the smallest anchor norm. A class's queries all sample its anchors and
    the cosine's gradient grows as 1 / |anchor|, so one anchor of small norm takes the class's whole loss with a
    large gradient (``docs/learning.md``, U2PL seed 1's exploding step)."""
    return {"contrastive_fewest_anchors": float(min(a.shape[0] for a in anchor_sets)),
            "contrastive_anchor_norm_min": torch.cat([a.norm(dim=1) for a in anchor_sets]).min()}


def _enqueue_negatives(teacher: Tensor, prob: Tensor, member: Tensor, unreliable: Tensor, num_labeled: int,
                       queues: ClassQueues, low_rank: int, high_rank: int, *, bugged: bool) -> None:
    """Enqueue every class's negative keys: labeled pixels not of class c with c in the teacher's top
    ``low_rank``; unreliable unlabeled pixels where c ranks in ``[low_rank, high_rank)``. ``bugged``: the
    released masks also require membership of class c, so labeled negatives never occur (U2PL #171).
    teacher ``[B, h, w, E]``, prob / member ``[B, K, h, w]``, unreliable ``[B, h, w]``."""
    batch = teacher.shape[0]
    is_labeled = (torch.arange(batch, device=teacher.device) < num_labeled).view(batch, 1, 1)
    valid = member.any(dim=1) | ~is_labeled
    rank = _class_ranks(prob)
    for c in range(prob.shape[1]):
        rank_c, member_c = rank[:, c], member[:, c]
        labeled_negative = is_labeled & valid & ~member_c & (rank_c < low_rank)
        unlabeled_negative = ~is_labeled & unreliable & (rank_c >= low_rank) & (rank_c < high_rank)
        if bugged:
            labeled_negative, unlabeled_negative = labeled_negative & member_c, unlabeled_negative & member_c
        queues.enqueue(c, all_gather_rows(teacher[labeled_negative | unlabeled_negative]))


def _check_inputs(rep_student: Tensor, rep_teacher: Tensor, prob_teacher: Tensor, labels: Tensor, queues: ClassQueues,
                  released_bugs: Sequence[str]) -> None:
    unknown = sorted(set(released_bugs) - set(U2PL_BUGS))
    if unknown:
        raise ValueError(f"released_bugs: unknown {unknown}, expected some of {list(U2PL_BUGS)}")
    if rep_student.shape != rep_teacher.shape or rep_student.dim() != 4:
        raise ValueError(
            "rep_student / rep_teacher: expected equal [B, E, h, w], "
            f"got {tuple(rep_student.shape)} and {tuple(rep_teacher.shape)}"
        )
    batch, dim, h, w = rep_student.shape
    num_classes = prob_teacher.shape[1]
    if prob_teacher.shape != (batch, num_classes, h, w) or labels.shape != (batch, h, w):
        raise ValueError(
            f"prob_teacher / labels: expected [{batch}, K, {h}, {w}] / [{batch}, {h}, {w}], "
            f"got {tuple(prob_teacher.shape)} / {tuple(labels.shape)}"
        )
    if queues.num_classes != num_classes or queues.dim != dim:
        raise ValueError(f"queues: expected {num_classes} classes of {dim}-d keys, got {queues.num_classes} of {queues.dim}")


def _class_ranks(prob: Tensor) -> Tensor:
    """Rank of every class per pixel: ``rank[b, c, y, x]`` = position of c in the descending sort of ``prob [B, K, h, w]``."""
    order = prob.argsort(dim=1, descending=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(prob.shape[1], device=prob.device).view(1, -1, 1, 1).expand_as(order))
    return rank


def _infonce(
    anchors: Tensor,
    positive: Tensor,
    negatives: Tensor,
    *,
    num_queries: int,
    num_negatives: int,
    temperature: float,
    generator: torch.Generator | None,
) -> Tensor:
    """InfoNCE of ``num_queries`` anchors drawn from ``anchors [n, E]`` against the class's mean teacher
    embedding ``positive [E]`` and ``num_negatives`` keys each drawn from ``negatives [m, E]``."""
    dim = anchors.shape[1]
    pick = torch.randint(anchors.shape[0], (num_queries,), device=anchors.device, generator=generator)
    anchor = anchors[pick]  # [Q, E]
    pick_neg = torch.randint(negatives.shape[0], (num_queries * num_negatives,), device=negatives.device, generator=generator)
    keys = torch.cat(
        [positive.expand(num_queries, 1, dim), negatives[pick_neg].view(num_queries, num_negatives, dim)], dim=1
    )  # [Q, 1 + N, E]
    logits = F.cosine_similarity(anchor.unsqueeze(1), keys, dim=2) / temperature
    return F.cross_entropy(logits, torch.zeros(num_queries, dtype=torch.long, device=logits.device))

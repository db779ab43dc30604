"""NPHead under torch.distributed: every rank enqueues the same (gathered) rows."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from npsemiseg.heads import IGNORE_INDEX, NPHead

C, K, D, WORLD = 6, 4, 4, 2


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)  # same initial weights on both ranks, as DDP would broadcast
        head = NPHead(C, K, latent_dim=D, memory_size=12, enqueue_per_class=4, hidden_channels=8, training_samples=2)
        torch.manual_seed(100 + rank)  # different data and different random subsets per rank
        for _ in range(2):
            features = torch.randn(2, C, 4, 4)
            # rank 0 sees classes 0 and 1 only, rank 1 classes 2 and 3 only; class 0 also on rank 1
            labels = torch.randint(0, 2, (2, 8, 8)) + 2 * rank
            labels[:, :2] = IGNORE_INDEX
            labels[:, 2:4] = 0
            head.train()(features, labels=labels, context_features=features[:1], context_labels=labels[:1])
        state = {k: v for k, v in head.state_dict().items() if "memory" in k or "centers" in k or "count" in k
                 or "pointer" in k}
        torch.save(state, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_memories_and_centers_identical_across_ranks(tmp_path):
    mp.spawn(_rank_main, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    # every class reached every rank although each rank saw only two of them
    assert (states[0]["target_count"] > 0).all() and (states[0]["context_count"] > 0).all()
    # per step and rank at most 4 rows per class: class 0 (both ranks) 2 x 2 x 4 = 16 rows, FIFO-bounded
    # at 12; the others (one rank each) 2 x 4 = 8
    assert states[0]["target_count"].tolist() == [12, 8, 8, 8]
    assert states[0]["target_pointer"].tolist() == [16 % 12, 8, 8, 8]

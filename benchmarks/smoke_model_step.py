"""One training step of the smoke model (``resnet_small``, narrow decoder) on CPU, per head.

Forward + cross-entropy (+ the head's aux loss) + backward + SGD step on a batch of small
images; prints one JSON line per (head, size) with the median wall and process-CPU seconds
over repetitions (CPU seconds are less sensitive to other load on a shared machine).

    .venv/bin/python benchmarks/smoke_model_step.py --sizes 32 64 --batch 4 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from npsemiseg.models import build_segmentor, upsample_logits

K = 21
HEAD_OPTIONS = {"baseline": {}, "mc_dropout": {}, "np": {"memory_size": 256, "enqueue_per_class": 64}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for head, options in HEAD_OPTIONS.items():
        model = build_segmentor(num_classes=K, head=head, head_options=options, variant="u2pl", backbone="resnet_small",
                                aspp_channels=16, low_level_channels=8)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for size in args.sizes:
            images = torch.rand(args.batch, 3, size, size)
            labels = torch.randint(0, K, (args.batch, size, size))
            times, cpu_times = [], []
            for repeat in range(args.repeats + 1):  # the first is a warm-up
                start, start_cpu = time.perf_counter(), time.process_time()
                output = model(images, labels=labels, num_context=args.batch // 2)
                logits = upsample_logits(output.head.logits, (size, size))
                loss = F.cross_entropy(logits.flatten(0, 1), labels.repeat(logits.shape[0], 1, 1)) + output.head.aux_loss
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                if repeat:
                    times.append(time.perf_counter() - start)
                    cpu_times.append(time.process_time() - start_cpu)
            print(json.dumps({"benchmark": "smoke_model_step", "head": head, "size": size, "batch": args.batch,
                              "threads": args.threads, "median_s": round(statistics.median(times), 4),
                              "all_s": [round(t, 4) for t in times],
                              "median_cpu_s": round(statistics.median(cpu_times), 4)}), flush=True)


if __name__ == "__main__":
    main()

"""Decoder-scope MC dropout: S decoder passes one at a time vs batched, on a full ResNet-50 U2PL model.

Times only the sampled part (decoder + MC-dropout head, the encoder output fixed), interleaving
the settings so machine load hits them alike, and prints one JSON line per (samples_per_pass, T)
with the median and all repetitions. Chooses ``npsemiseg.models.segmentor.DEFAULT_SAMPLES_PER_PASS``.

    .venv/bin/python benchmarks/mc_dropout_decoder_passes.py --size 321 --samples 5 10 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from npsemiseg.heads import MCDropoutHead
from npsemiseg.models import build_segmentor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=321, help="square input size (center crop)")
    parser.add_argument("--samples", type=int, nargs="+", default=[5, 10], help="values of T")
    parser.add_argument("--per-pass", type=int, nargs="+", default=[1, 0], help="samples per pass (0 = all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build_segmentor(num_classes=21, head=MCDropoutHead(512, 21), variant="u2pl", backbone="resnet50")
    model = model.to(device).eval()
    images = torch.rand(1, 3, args.size, args.size, device=device)
    with torch.inference_mode():
        encoded = model.encode(images)

        def run(per_pass: int, samples: int) -> tuple[float, float]:
            """(wall seconds, process CPU seconds: less sensitive to other load on a shared machine)."""
            model.samples_per_pass = per_pass or None
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, start_cpu = time.perf_counter(), time.process_time()
            model.sample_decoder(encoded, num_samples=samples)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start, time.process_time() - start_cpu

        for per_pass in args.per_pass:  # warm-up
            run(per_pass, 1)
        for samples in args.samples:
            times: dict[int, list[tuple[float, float]]] = {p: [] for p in args.per_pass}
            for repeat in range(args.repeats):
                order = args.per_pass if repeat % 2 == 0 else list(reversed(args.per_pass))
                for per_pass in order:
                    times[per_pass].append(run(per_pass, samples))
            for per_pass, values in times.items():
                wall, cpu = zip(*values)
                print(json.dumps({
                    "benchmark": "mc_dropout_decoder_passes", "device": str(device),
                    "machine": platform.processor() or platform.machine(), "threads": args.threads,
                    "size": args.size, "T": samples, "samples_per_pass": per_pass or samples,
                    "median_s": round(statistics.median(wall), 3), "all_s": [round(v, 3) for v in wall],
                    "median_cpu_s": round(statistics.median(cpu), 3), "all_cpu_s": [round(v, 3) for v in cpu],
                }), flush=True)


if __name__ == "__main__":
    main()

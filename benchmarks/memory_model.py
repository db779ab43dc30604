"""The memory model's table (``npsemiseg/memory_model.json``): each framework x head x backbone's model state,
counted on fake tensors (no GPU, seconds per entry), beside the measured GPU steps it is scaled from.

    python benchmarks/memory_model.py            # rewrites npsemiseg/memory_model.json's "state" entries
    python benchmarks/memory_model.py --compare  # the model against GPU steps it was not fitted to
    python benchmarks/memory_model.py --measured benchmarks/results/gpu_acceptance/gpu_acceptance.json  # a new GPU's

Each entry: ``held_mib`` (parameters and buffers of every network: students, EMA teachers, queues, the NP
head's memories) and ``trainable_mib`` (the student's trainable parameters: each adds a gradient and the
optimiser's slots). ``npsemiseg.hardware_plan`` reads them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from npsemiseg.config import cell_config
from npsemiseg.training.fake_memory import model_state_mib

TABLE = Path(__file__).resolve().parents[1] / "npsemiseg" / "memory_model.json"
RESNET_FRAMEWORKS = ["supervised", "mt", "mt_cps", "psmt", "u2pl", "augseg", "fixmatch", "unimatch"]
VIT_FRAMEWORKS = ["unimatch_v2", "fixmatch_v2"]
HEADS = ["baseline", "mc_dropout", "np"]


H200 = "one NVIDIA H200, 2026-11-27, gpu_acceptance.py --device cuda --steps 5 (docs/performance.md)"
H100 = "one NVIDIA H100 80GB, 2026-11-27, make gpu-check (docs/performance.md)"
H200_VIT = "one NVIDIA H200, 2026-11-27, gpu_acceptance.py --backbone dinov2_* --crop 518 (docs/performance.md)"
H200_GPU_CHECK = "one NVIDIA H200, 2026-11-29, make gpu-check (docs/performance.md)"
#: measured peaks (``max_memory_allocated``, MiB) of one step, bf16 autocast, random init: baseline, MC dropout, NP
#: (the UniMatch V2 family's paper preset: 4 + 4 crops of 518, the others 3 + 3 of 480). FixMatch's is its current
#: step's (2026-11-29): its peak fell from 4,883 MiB (2026-11-27) as the step changed, and a model fitted to the
#: older step predicted the current one at 1.10x-1.12x
MEASURED = {
    ("supervised", "resnet101", 480, 3, "", H200): (3737, 3737, 4318),
    ("mt", "resnet101", 480, 6, "", H200): (6980, 6925, 8098),
    ("mt_cps", "resnet101", 480, 6, "", H200): (7366, 7364, 8231),
    ("psmt", "resnet101", 480, 6, "", H200): (12076, 9174, 13570),
    ("u2pl", "resnet101", 480, 6, "", H200): (8645, 8483, 9130),
    ("augseg", "resnet101", 480, 6, "", H200): (3793, 3739, 4886),
    ("fixmatch", "resnet101", 480, 6, "", H200_GPU_CHECK): (4377, 4379, 4981),
    ("unimatch", "resnet101", 480, 6, "", H200): (6250, 6204, 7475),
    ("unimatch_v2", "resnet101", 518, 8, "", H100): (7675, 7583, 9580),
    ("fixmatch_v2", "resnet101", 518, 8, "", H100): (5563, 5485, 7215),
    ("unimatch_v2", "dinov2_s", 518, 6, "", H200_VIT): (6048, 6235, 13274),
    ("unimatch_v2", "dinov2_b", 518, 6, "", H200_VIT): (10123, 10585, 17406),
}
#: measured peaks (MiB) of the NP head on a pooled map (``feature_pool``, the corrected default ``coarse``: 4 on the
#: DPT), bf16, 4 + 4 crops of 518; the entries above hold the full map's (``feature_pool`` 1)
MEASURED_POOLED_NP = {
    ("unimatch_v2", "dinov2_s", 518, 8, "coarse", H200_GPU_CHECK): 5478,
    ("unimatch_v2", "dinov2_b", 518, 8, "coarse", H200_GPU_CHECK): 10571,
}


#: held-out GPU steps (not fitted): the H100's ResNet-101 steps (another card, another run) and DINOv2 at 4 + 4 images
#: (its NP head on the full map, ``feature_pool`` 1: the default before the corrected protocol pooled it)
HELD_OUT = {
    ("supervised", "resnet101", 480, 3, 3, H100): (3738, 3739, 4308),
    ("mt", "resnet101", 480, 3, 3, H100): (6978, 6929, 8077),
    ("mt_cps", "resnet101", 480, 3, 3, H100): (7368, 7367, 8207),
    ("psmt", "resnet101", 480, 3, 3, H100): (12076, 9182, 13569),
    ("u2pl", "resnet101", 480, 3, 3, H100): (8639, 8487, 9106),
    ("augseg", "resnet101", 480, 3, 3, H100): (3795, 3743, 4859),
    ("fixmatch", "resnet101", 480, 3, 3, H100): (4614, 4614, 5209),
    ("unimatch", "resnet101", 480, 3, 3, H100): (6374, 6381, 7707),
    ("unimatch_v2", "dinov2_s", 518, 4, 4, H100): (8008, 8222, 17419),
    ("unimatch_v2", "dinov2_b", 518, 4, 4, H100): (13302, 13894, 22775),
}


HEADER = ["| framework | backbone | images | head | predicted MiB | measured MiB | predicted / measured |",
          "| --- | --- | --- | --- | --- | --- | --- |"]


def compared_row(framework: str, head: str, backbone: str, crop: int, labeled: int, unlabeled: int, bf16: bool,
                 measured: float) -> str:
    """One step predicted against its measured peak, a Markdown row (``**miss**`` beyond 10 %).

    ``head`` is a registered head or ``np_pool<p>``, the NP head at ``feature_pool`` p (``gpu_acceptance.py
    --vit-np-pools``)."""
    from npsemiseg.hardware_plan import predict_peak_mib

    overrides = {"model.backbone": backbone, "schedule.crop_size": crop, "runtime.amp": bf16}
    registered = head
    if head.startswith("np_pool"):
        registered, overrides["head.options.feature_pool"] = "np", int(head.removeprefix("np_pool"))
    config = cell_config("paper", framework=framework, dataset="synthetic_voc", partition="1464", head=registered,
                         **overrides)
    unlabeled = unlabeled if framework != "supervised" else 0
    try:
        predicted = predict_peak_mib(config, labeled, unlabeled)
    except ValueError as error:
        return f"| {framework} | {backbone} | {labeled} + {unlabeled} x {crop}^2 | {head} | none ({error}) | " \
               f"{measured:,.0f} | |"
    ratio = predicted / measured
    verdict = f"{ratio:.3f}" + (" **miss**" if abs(ratio - 1) > 0.10 else "")
    return (f"| {framework} | {backbone} | {labeled} + {unlabeled} x {crop}^2 | {head} | {predicted:,.0f} | "
            f"{measured:,.0f} | {verdict} |")


def compare() -> list[str]:
    """Predicted against measured for the held-out steps, as Markdown rows."""
    rows = list(HEADER)
    for (framework, backbone, crop, labeled, unlabeled, _), peaks in HELD_OUT.items():
        heads = [*HEADS[:2], "np_pool1"] if backbone.startswith("dinov2") else HEADS
        for head, measured in zip(heads, peaks):
            rows.append(compared_row(framework, head, backbone, crop, labeled, unlabeled, True, measured))
    return rows


def compare_report(path: Path) -> list[str]:
    """Predicted against a ``gpu_acceptance.py`` report's CUDA steps (``make gpu-check``), as Markdown rows."""
    report = json.loads(path.read_text())
    rows = list(HEADER)
    for cell in [*report.get("cells", []), *report.get("vit_cells", [])]:
        if "error" in cell or cell.get("peak_memory_measure") != "max_memory_allocated":
            continue
        rows.append(compared_row(cell["framework"], cell["head"], cell["backbone"], cell["crop"],
                                 cell["labeled_batch"], cell["unlabeled_batch"], bool(cell["amp_bf16"]),
                                 cell["peak_memory_mib"]))
    return rows


def measured_entries() -> dict[str, dict[str, object]]:
    """The measured steps by ``framework|head|backbone`` (the pooled NP head's as ``np@<pool>``)."""
    steps = [(framework, head, backbone, crop, images, source, peak)
             for (framework, backbone, crop, images, _, source), peaks in MEASURED.items()
             for head, peak in zip(HEADS, peaks)]
    steps += [(framework, f"np@{pool}", backbone, crop, images, source, peak)
              for (framework, backbone, crop, images, pool, source), peak in MEASURED_POOLED_NP.items()]
    optims = {framework: cell_config("paper", framework=framework, dataset="synthetic_voc", partition="1464").optim.name
              for framework, *_ in steps}
    return {f"{framework}|{head}|{backbone}": {"peak_mib": peak, "crop": crop, "images": images,
                                               "optim": optims[framework], "source": source}
            for framework, head, backbone, crop, images, source, peak in steps}


def entries() -> list[tuple[str, str, str]]:
    resnet = [(f, h, b) for f in RESNET_FRAMEWORKS + VIT_FRAMEWORKS for h in HEADS for b in ("resnet50", "resnet101")]
    vit = [(f, h, b) for f in VIT_FRAMEWORKS for h in HEADS for b in ("dinov2_s", "dinov2_b")]
    return resnet + vit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true", help="print predicted against held-out measured steps")
    parser.add_argument("--measured", type=Path, help="a gpu_acceptance.json: predicted against its CUDA steps")
    parser.add_argument("--out", type=Path, help="also write the comparison to this Markdown file")
    args = parser.parse_args()
    if args.compare or args.measured:
        text = "\n".join(compare_report(args.measured) if args.measured else compare())
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        return
    table = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    table["measured"] = measured_entries()
    state = table.setdefault("state", {})
    for framework, head, backbone in entries():
        key = f"{framework}|{head}|{backbone}"
        if key in state:
            continue
        config = cell_config("paper", framework=framework, dataset="synthetic_voc", partition="1464", head=head,
                             **{"model.backbone": backbone, "model.weights": None, "runtime.device": "cpu"})
        held, trainable = model_state_mib(config)
        state[key] = {"held_mib": round(held, 1), "trainable_mib": round(trainable, 1)}
        print(key, state[key], flush=True)
        TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

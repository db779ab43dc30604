#!/usr/bin/env bash
# `make gpu-check`: everything the first minutes on a lent GPU should measure, in order of importance, each part
# under its own time limit so that one slow part cannot take the others' time (at most about 8 minutes on one H100):
#   1. gpu_acceptance.py: every framework x head at paper scale (eager; operator calls and device reads per step),
#      the one-rank NCCL cell, inference, UniMatch V2 on DINOv2-S/-B (the NP head at the corrected default, the DPT's
#      1/7 map, and again on the DPT's map as it is: --vit-np-pools 1), the paper grids' GPU-hours;
#   2. official_side_by_side.py: the project's step beside the official loops (needs OFFICIAL_ROOT, a folder of the
#      official checkouts; skipped with a line saying so without it);
#   2b. memory_model.py --measured: the memory model's predicted peaks against part 1's measured ones;
#   3. loader_throughput.py: the data pipeline's images/s against the steps of part 1;
#   4. gpu_acceptance.py --compile: eager against torch.compile for a few cells (compilation time reported apart).
# Results: $GPU_CHECK_OUT (default benchmarks/results/gpu_acceptance/), one folder per part. Exit 1 if a part failed.
set -u
PY=${PY:-python}
OUT=${GPU_CHECK_OUT:-benchmarks/results/gpu_acceptance}
OFFICIAL_ROOT=${OFFICIAL_ROOT:-}
COMPILE_MODE=${COMPILE_MODE:-default}
status=0
part() {  # part SECONDS NAME COMMAND...
    local limit=$1 name=$2; shift 2
    echo "== $name (at most ${limit} s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" || { echo "== $name: exit $? after $((SECONDS - start)) s"; status=1; return; }
    echo "== $name: done in $((SECONDS - start)) s"
}
# Preflight: the modules the parts import. A lent GPU's image brings its own torch; the rest can be carried as wheels
# and put on PYTHONPATH (docs/performance.md, GPU acceptance). A missing one is named here, once, and the parts run on.
"$PY" - <<'EOF' || status=1
import importlib.util
needed = ["torch", "torchvision", "timm", "numpy", "scipy", "PIL", "pydantic", "yaml", "albumentations", "npsemiseg"]
missing = [name for name in needed if importlib.util.find_spec(name) is None]
print(f"== preflight: missing {', '.join(missing)}: the parts that import them will fail" if missing
      else "== preflight: every module the parts import is there")
raise SystemExit(1 if missing else 0)
EOF
part 240 acceptance "$PY" benchmarks/gpu_acceptance.py --device cuda --host-work --steps 5 \
    --vit dinov2_s dinov2_b --vit-np-pools 1 --out "$OUT" "$@"
part 60 memory-model "$PY" benchmarks/memory_model.py --measured "$OUT/gpu_acceptance.json" \
    --out "$OUT/memory_model.md"
if [ -n "$OFFICIAL_ROOT" ]; then
    part 90 side-by-side "$PY" benchmarks/official_side_by_side.py --device cuda --official-root "$OFFICIAL_ROOT" \
        --steps 6 --host-work --out "$OUT/side_by_side"
else
    echo "== side-by-side: skipped (OFFICIAL_ROOT=DIR names a folder of the official checkouts: docs/performance.md)"
fi
part 60 loader "$PY" benchmarks/loader_throughput.py --raw cached --batches 2 --rounds 2 \
    --steps-from "$OUT/gpu_acceptance.json" --out "$OUT/loader"
part 150 compiled "$PY" benchmarks/gpu_acceptance.py --device cuda --steps-only --steps 5 --compile "$COMPILE_MODE" \
    --frameworks supervised unimatch --heads baseline np --out "$OUT/compiled"
exit $status

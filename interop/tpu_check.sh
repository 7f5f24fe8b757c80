#!/usr/bin/env bash
# On a machine with a TPU: compile the megakernel with Mosaic, run it, and diff it against the reference (the
# check that cannot run on a CPU host; docs/tpu.md). Usage, from a checkout:
#   bash interop/tpu_check.sh [CHIP]        # CHIP: v5e, v5p, v6e or v7 (default v7); results in runs/tpu-check/
# It installs jax's TPU build (the same jax version) into .venv, then for each model and dtype runs
# `evalsuite diff --engine-option interpret=mosaic` and keeps each diff's JSON. Exit 0 when every diff PASSes.
set -euo pipefail
cd "$(dirname "$0")/.."
chip="${1:-v7}"
bash install.sh >/dev/null
jax_version="$(.venv/bin/python -c 'import jax; print(jax.__version__)')"
.venv/bin/pip install -q "jax[tpu]==${jax_version}"
backend="$(.venv/bin/python -c 'import jax; print(jax.default_backend())')"
if [ "$backend" != "tpu" ]; then
  echo "error: jax here runs on ${backend}; this script needs a TPU host" >&2
  exit 2
fi
# float32 matmuls in XLA on TPU default to bf16 passes: the reference (the judge) must run at full precision
export JAX_DEFAULT_MATMUL_PRECISION=highest
out=runs/tpu-check
mkdir -p "$out"
status=0
for model in mini-llama mini-moe smollm2-135m; do
  for dtype in float32 bfloat16; do
    set +e
    .venv/bin/evalsuite diff --model "$model" --dtype "$dtype" --engine megakernel \
      --engine-option interpret=mosaic --engine-option chip="$chip" --json > "$out/diff-$model-$dtype.json"
    rc=$?
    set -e
    echo "$model $dtype: exit $rc ($out/diff-$model-$dtype.json)"
    [ "$rc" -eq 0 ] || status=1
  done
done
.venv/bin/python -m benchmarks.vmem --model mini-llama --model mini-moe --model smollm2-135m --chip "$chip" > "$out/budget.txt"
exit "$status"

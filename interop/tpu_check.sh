#!/usr/bin/env bash
# On a machine with a TPU: run the reference on the chip against the CPU-made golden files (the cross-hardware
# check), then compile the megakernel with Mosaic, run it and diff it against the reference (the checks a CPU host
# cannot run; docs/tpu.md). Usage, from a checkout:
#   bash interop/tpu_check.sh [--wheels DIR] [CHIP]   # CHIP: v5e, v5p, v6e or v7 (default: the chip jax reports)
# With internet: installs .venv by install.sh and jax's TPU build at the same version. Without (a TPU host that
# reaches no package index): --wheels DIR installs the wheels `bash interop/tpu_wheels.sh` made elsewhere beside
# the host's own jax. Results: runs/tpu-check/ (summary.json and each command's JSON). Exit 0 when every check
# ran and PASSes, 1 when one FAILs, 3 when a step ran nothing (not checked), 2 when jax here runs on no TPU.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="" chip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="${2:?--wheels needs a directory}"; shift 2 ;;
    *) chip="$1"; shift ;;
  esac
done
if [ -n "$wheels" ]; then
  site="${TMPDIR:-/tmp}/evalsuite-site"
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site"  # the checkout first, the host's jax before the wheels
  py=python3
else
  bash install.sh >/dev/null
  jax_version="$(.venv/bin/python -c 'import jax; print(jax.__version__)')"
  .venv/bin/pip install -q "jax[tpu]==${jax_version}"
  py=.venv/bin/python
fi
export PYTHONUNBUFFERED=1
exec "$py" -m interop.tpu_check ${chip:+--chip "$chip"} --out runs/tpu-check

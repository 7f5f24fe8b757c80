#!/usr/bin/env bash
# On a machine with PyPI, for a TPU host without it: put into .whl-tpu/ the wheels a TPU host needs beside its own
# jax (evalsuite's pure-Python dependencies at the versions .venv pins, and evalsuite itself), for
# `bash interop/tpu_check.sh --wheels .whl-tpu` there (docs/tpu.md). Usage: bash interop/tpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "tpu_wheels.sh: run bash install.sh first (the versions come from .venv)" >&2; exit 2; }
rm -rf .whl-tpu && mkdir .whl-tpu
# what `evalsuite diff` and `golden check` import beyond jax and numpy (a TPU host brings those itself)
names="click jinja2 markupsafe tokenizers safetensors filelock cloudpickle pygments gguf pyyaml tqdm flatbuffers"
pins=$(for n in $names; do .venv/bin/python -m pip show "$n" 2>/dev/null | awk -v n="$n" '/^Version:/{print n"=="$2}'; done)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl-tpu $pins
.venv/bin/python -m pip wheel -q --no-deps . -w .whl-tpu
echo "tpu_wheels.sh: $(ls .whl-tpu | wc -l) wheels, $(du -sh .whl-tpu | cut -f1) in .whl-tpu"

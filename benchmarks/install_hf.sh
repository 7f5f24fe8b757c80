#!/usr/bin/env bash
# Creates .venv-hf: torch CPU + transformers + lm-eval's hf backend, for benchmarks/fewshot.py only.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-hf/bin/python ] || "$PY" -m venv .venv-hf
.venv-hf/bin/pip install -q --upgrade pip
# Pinned before lm_eval[hf] so its bare `torch` requirement is already met (on the project's
# machines the registry serves a CPU build of 2.13.0).
.venv-hf/bin/pip install -q torch==2.13.0
.venv-hf/bin/pip install -q -r benchmarks/requirements-hf.txt
# flash-linear-attention's naive recurrences, the delta rule's unit oracle (benchmarks/fla_oracle.py): outside
# site-packages, so transformers never takes fla's Triton kernels for its own Qwen3-Next and Kimi Linear code.
.venv-hf/bin/pip install -q einops==0.8.1
.venv-hf/bin/pip install -q --no-deps --target .venv-hf/fla fla-core==0.6.0

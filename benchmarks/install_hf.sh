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

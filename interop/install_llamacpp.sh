#!/usr/bin/env bash
# Creates .venv-llamacpp: llama.cpp's OpenAI-compatible server (llama-cpp-python[server]), a peer
# engine for `nox -s interop`. PyPI has only the source distribution for this platform, so pip
# compiles llama.cpp (about 9 minutes on 2 cores). Never installed into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -x .venv-llamacpp/bin/python ] && .venv-llamacpp/bin/python -c "import llama_cpp.server" 2>/dev/null; then
  echo "llama.cpp server already in .venv-llamacpp"; exit 0
fi
[ -x .venv-llamacpp/bin/python ] || "$PY" -m venv .venv-llamacpp
.venv-llamacpp/bin/pip install -q --upgrade pip
# Portable CPU build; no BLAS, no GPU. Pinned: the server's request schema and its echo/logprob
# behaviour are what the interop matrix records.
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  .venv-llamacpp/bin/pip install -q -r interop/requirements-llamacpp.txt
.venv-llamacpp/bin/python -c "import llama_cpp, llama_cpp.server; print('llama-cpp-python', llama_cpp.__version__)"

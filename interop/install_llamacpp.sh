#!/usr/bin/env bash
# Creates llama.cpp's OpenAI-compatible server (llama-cpp-python[server]), a peer engine for
# `nox -s interop`, in its own environment:
#   bash interop/install_llamacpp.sh            portable build (GGML_NATIVE=OFF) in .venv-llamacpp
#   bash interop/install_llamacpp.sh native     default (native CPU flags) build in .venv-llamacpp-native
# The two builds behave differently under some request sequences, so the matrix runs both. PyPI has
# only the source distribution for this platform, so pip compiles llama.cpp (about 9 minutes on 2
# cores, each). Never installed into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD=${1:-portable}
case "$BUILD" in
  portable) VENV=.venv-llamacpp; FLAGS="-DGGML_NATIVE=OFF" ;;
  native) VENV=.venv-llamacpp-native; FLAGS="" ;;
  *) echo "install_llamacpp.sh: unknown build '$BUILD' (portable, native)"; exit 2 ;;
esac
if [ -x $VENV/bin/python ] && $VENV/bin/python -c "import llama_cpp.server" 2>/dev/null; then
  echo "llama.cpp server ($BUILD) already in $VENV"; exit 0
fi
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
$VENV/bin/pip install -q --upgrade pip
# CPU only; no BLAS, no GPU. Pinned: the server's request schema and its echo/logprob behaviour are
# what the interop matrix records. --no-cache-dir: a cached wheel of the other build must not be reused.
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  CMAKE_ARGS="$FLAGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  $VENV/bin/pip install -q --no-cache-dir -r interop/requirements-llamacpp.txt
$VENV/bin/python -c "import llama_cpp, llama_cpp.server; print('llama-cpp-python', llama_cpp.__version__, '($BUILD)')"

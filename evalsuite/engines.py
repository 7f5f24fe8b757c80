"""Build an engine by name for a loaded model (the one place the CLI picks an implementation)."""

from __future__ import annotations

from engines.errors import ModelError
from evalsuite.registry import Model

ENGINES = ("reference",)


def make_engine(name: str, model: Model, dtype: str = "float32", fault: str | None = None):
    """An object implementing engines.base.Engine."""
    if name == "reference":
        if fault:
            raise ModelError("--fault applies to the megakernel engine only")
        from engines.reference import ReferenceEngine

        return ReferenceEngine(model.weights, dtype)
    raise ModelError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")

"""Build an engine by name for a loaded model (the one place the CLI picks an implementation)."""

from __future__ import annotations

from engines.errors import ModelError
from evalsuite.registry import Model

ENGINES = ("reference", "megakernel", "openai")


def make_engine(name: str, model: Model, dtype: str = "float32", fault: str | None = None, remote=None):
    """An object implementing engines.base.Engine. fault: megakernel self-test aid (off by default).
    remote (engines.openai.client.Remote): where the openai engine's server is."""
    if name != "openai" and remote is not None and remote.base_url:
        raise ModelError(f"--base-url applies to --engine openai, not {name}")
    if name == "openai":
        if fault:
            raise ModelError("--fault applies to the megakernel engine only (start `evalsuite serve --fault F`)")
        if remote is None or not remote.base_url:
            raise ModelError("--engine openai needs --base-url URL (e.g. http://127.0.0.1:8000/v1)")
        from engines.openai import OpenAIEngine

        return OpenAIEngine(remote, model.config, model.tokenizer, dtype)
    if name == "reference":
        if fault:
            raise ModelError("--fault applies to the megakernel engine only")
        from engines.reference import ReferenceEngine

        return ReferenceEngine(model.weights, dtype)
    if name == "megakernel":
        from engines.megakernel import MegakernelEngine

        return MegakernelEngine(model.weights, dtype, fault=fault)
    import difflib

    close = difflib.get_close_matches(name, ENGINES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ModelError(f"unknown engine {name!r}{hint} (expected one of {', '.join(ENGINES)})")

"""`evalsuite generate`: one prompt through one engine, as a JSON-ready dict."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from evalsuite.models import load_model
from evalsuite.plugins import make_engine
from evalsuite.versions import versions


@dataclass(frozen=True)
class GenerateSpec:
    engine: str
    model: str
    prompt: str
    chat: bool = False
    max_new_tokens: int = 32
    stop: bool = True
    top_logprobs: int = 5
    dtype: str = "float32"
    fault: str | None = None
    engine_options: tuple[tuple[str, str], ...] = ()  # --engine-option KEY=VALUE


def run_generate(spec: GenerateSpec) -> dict:
    m = load_model(spec.model)
    if m.tokenizer is None:
        from engines.errors import ModelError

        raise ModelError(f"model {spec.model} has no tokenizer: text prompts are impossible")
    eng = make_engine(spec.engine, m, spec.dtype, spec.fault, dict(spec.engine_options))
    ids = m.tokenizer.encode_chat(spec.prompt) if spec.chat else m.tokenizer.encode(spec.prompt)
    stop = m.tokenizer.eos_ids if spec.stop else ()
    g = eng.generate([ids], spec.max_new_tokens, stop_ids=stop, top_k=spec.top_logprobs)[0]
    return {
        "model": spec.model,
        "engine": spec.engine,
        "dtype": spec.dtype,
        "fault": spec.fault,
        "weights_sha256": m.weights.sha256,
        "prompt_token_ids": ids,
        "token_ids": g.token_ids,
        "text": m.tokenizer.decode(g.token_ids, skip_special=True),
        "finish_reason": g.finish_reason,
        "top_logprobs": [[{"id": int(i), "logprob": float(v)} for i, v in zip(ids_, lps)]
                         for ids_, lps in zip(g.top_ids, g.top_logprobs)],
        "placement": eng.placement(),
        "spec": asdict(spec),
        "versions": versions(),
    }

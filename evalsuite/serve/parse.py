"""Request parsing for `evalsuite serve`: pure functions from a request body to what the worker runs, and
the errors (OpenAI-style, with the offending field) for what greedy serving refuses."""

from __future__ import annotations

import json

from engines.base import check_prompts
from engines.errors import ModelError

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a 2,048-token prompt as JSON ids is about 12 KB
MAX_TOKENS = 2048  # per request, and prompt + max_tokens must fit the model's context
MAX_PROMPTS = 64  # prompts in one /v1/completions request (lm-eval batches several)
MAX_LOGPROBS = 20  # as OpenAI's top_logprobs bound
MAX_QUEUE = 256  # waiting jobs beyond this get 503 (retry later) instead of unbounded memory
NEUTRAL_PENALTIES = {"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1, "repeat_penalty": 1}
BATCH_WAIT_S = 0.01  # how long the worker waits for more requests to batch with the first


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param



def check_model(body: dict, served: str) -> None:
    m = body.get("model")
    if m is not None and m != served:
        raise APIError(404, f"The model `{m}` does not exist; this server serves `{served}`",
                       "NotFoundError", "model")

def sampling(body: dict, default_max: int) -> tuple[int, tuple[str, ...]]:
    """(max_tokens, stop strings) of a completion request; 400 for what greedy serving refuses."""
    if body.get("stream"):
        raise APIError(400, "stream is not supported", param="stream")
    t = body.get("temperature", 0)
    if not isinstance(t, (int, float)) or t != 0:
        raise APIError(400, f"temperature {t!r}: this server decodes greedily only (temperature 0)",
                       param="temperature")
    if body.get("n", 1) != 1:
        raise APIError(400, "n must be 1 (greedy decoding gives one answer)", param="n")
    for name, neutral in NEUTRAL_PENALTIES.items():  # accepted only where they change nothing
        v = body.get(name)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v != neutral):
            raise APIError(400, f"{name} {v!r}: this server decodes greedily only ({name} must be {neutral})",
                           param=name)
    mt = body.get("max_tokens", body.get("max_completion_tokens", default_max))
    if mt is None:
        mt = default_max
    if not isinstance(mt, int) or isinstance(mt, bool) or not 0 <= mt <= MAX_TOKENS:
        raise APIError(400, f"max_tokens must be an integer in [0, {MAX_TOKENS}], got {mt!r}", param="max_tokens")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 8:
        raise APIError(400, "stop must be a string or a list of at most 8 strings", param="stop")
    return mt, tuple(s for s in stop if s)

def prompt_ids(prompt, tok, vocab: int) -> list[list[int]]:
    """OpenAI's prompt forms: a string, a list of ids, or a list of either."""
    if isinstance(prompt, str):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(x) for x in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise APIError(400, "prompt must be a non-empty string, list of token ids, or list of those",
                       param="prompt")
    if len(items) > MAX_PROMPTS:
        raise APIError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(items)}", param="prompt")
    out = []
    for x in items:
        if isinstance(x, str):
            out.append(tok.encode(x))
        elif isinstance(x, list) and all(_is_int(t) for t in x):
            out.append(list(x))
        else:
            raise APIError(400, "each prompt must be a string or a list of integer token ids", param="prompt")
    try:  # the one prompt validation (empty prompts, ids outside the vocabulary); context: check_length
        check_prompts(out, vocab, 1 << 62, 1)
    except ModelError as e:
        raise APIError(400, str(e), param="prompt") from None
    return out


def check_length(prompts: list[list[int]], max_tokens: int, ctx: int) -> None:
    for ids in prompts:
        if len(ids) + max_tokens > ctx:
            raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, you "
                                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                                f"{max_tokens} for the completion).", param="prompt")



def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)



def json_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"null")
    except json.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
        raise APIError(400, "messages must be a non-empty list of {role, content} objects with string content",
                       param="messages")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]

"""The engine protocol: the only thing evalsuite knows about an engine.

An engine turns token ids into logits. It declares what it can do in `capabilities`:
  "score"    teacher-forced logits for given sequences       (Engine.score)
  "generate" batched greedy generation with stop ids         (Engine.generate)
  "taps"     the residual stream after every layer            (score(..., want_taps=True), and
             step_taps(prompts, next_ids) for one decode step, where the engine has a decode path)
  "logits"   full-vocabulary logits at generated positions    (generate(..., want_logits=True))
Every engine also provides decode_forced(prompts, continuations): the logits its own decode path
produces when fed the given tokens one by one (what `diff` and `golden check` compare).

A new engine (your own megakernel) plugs in by implementing this protocol; evalsuite never
imports an engine's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from engines.config import Config


@dataclass
class Scored:
    """Teacher-forced result for one sequence of T tokens.

    logits [T, V] float32: row t is the distribution of token t+1 given tokens 0..t.
    taps [L, T, D] float32 or None: the residual stream after each layer.
    """

    logits: np.ndarray
    taps: np.ndarray | None = None


@dataclass
class Generation:
    """Greedy continuation of one prompt.

    token_ids: generated ids (a stop id, when hit, is included and ends the list).
    top_ids, top_logprobs [N, k]: the k most likely ids at each generated position and their
    log-softmax values of the float32 logits, most likely first. logits [N, V] when asked for.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    finish_reason: str  # "stop" or "length"
    logits: np.ndarray | None = None
    # An HTTP engine whose server returns no token ids rebuilds them from text; where that text is not
    # valid UTF-8 (a byte-level token cut mid-character) the rebuilt ids are not the engine's: then
    # ids_exact is False and `text` is what the server returned, to be compared as text.
    ids_exact: bool = True
    text: str | None = None


@runtime_checkable
class Engine(Protocol):
    name: str
    config: Config
    dtype: str
    capabilities: frozenset[str]

    def score(self, seqs: Sequence[Sequence[int]], want_taps: bool = False) -> list[Scored]: ...

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 stop_ids: Sequence[int] = (), top_k: int = 5,
                 want_logits: bool = False, stop_check: StopCheck | None = None) -> list[Generation]: ...

    def decode_forced(self, prompts: Sequence[Sequence[int]],
                      continuations: Sequence[Sequence[int]]) -> list[np.ndarray]: ...


DTYPES = ("float32", "bfloat16")
# stop_check(generated_ids) -> True ends that row (finish_reason "stop"), e.g. when the decoded text
# contains a stop string: rows stop generating at once instead of running to max_new_tokens.
StopCheck = Callable[[list[int]], bool]


def next_pow2(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum): the shape buckets that bound recompilation."""
    n = max(n, minimum)
    return 1 << (n - 1).bit_length()


def source_fingerprint(package_dir, spec: dict) -> str:
    """What an in-process engine IS, for reuse decisions: sha256 over the engine's own source files
    (its package and the shared engines/*.py it runs on), the jax/jaxlib versions and its static spec
    (dtype, fault, tile sizes...). Changing one line of the kernel changes it."""
    import hashlib
    import json
    from importlib.metadata import version
    from pathlib import Path

    h = hashlib.sha256()
    shared = Path(__file__).resolve().parent
    for f in sorted(Path(package_dir).glob("*.py")) + sorted(shared.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(json.dumps({"jax": version("jax"), "jaxlib": version("jaxlib"), "spec": spec},
                        sort_keys=True, default=str).encode())
    return h.hexdigest()

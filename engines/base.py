"""The engine protocol: the only thing evalsuite knows about an engine.

An engine is a subclass of `Engine` (an abstract base class: a subclass that misses a method cannot
be built, and evalsuite says which one). It has an identity (name, weights_sha256, dtype,
fingerprint), a `max_batch`, typed frozen `Capabilities`, and two methods every engine implements:
  generate(prompts, max_new_tokens, ...)  batched greedy generation with top-k logprobs
  forced_topk(prompts, continuations, k)  teacher-forced top-k logprobs along given tokens, from
                                          the engine's decode path (an HTTP engine: from echo)
and optional ones: score_topk(prompts, continuations, k), forced_topk's records from one forward pass a row
(default: forced_topk itself), and, offered where `capabilities` says so:
  score(seqs, want_taps)                  full-vocabulary logits of a forward pass (and taps)
  step_taps(prompts, next_ids)            the residual stream after every layer for one decode step
  forced_routing(prompts, continuations)  the experts each MoE layer chose along forced_topk's path
What an engine lacks is reported by the checks as "not checked", never branched around.

Engines are found by entry point (group `evalsuite.engines`, value `module:Class`); the class's
`create(model, options)` builds one and its `faults` lists the fault names it accepts. The built-in
engines are declared the same way in pyproject.toml. evalsuite never imports an engine's internals.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from engines.config import Config
from engines.errors import ModelError
from engines.fingerprint import source_fingerprint  # noqa: F401  (the engines' public part)
from engines.recipe import DTYPES, ROUND_POINTS, Recipe  # noqa: F401  (the engines' public part)
from engines.shapes import call_groups, next_bucket, next_pow2  # noqa: F401  (the engines' public part)

# stop_check(generated_ids) -> True ends that row (finish_reason "stop"), e.g. when the decoded text
# contains a stop string: rows stop generating at once instead of running to max_new_tokens.
StopCheck = Callable[[list[int]], bool]


# ---- numeric helpers, defined once (numpy, float64 inside) ------------------------------------------
def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def top_k(logprobs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [..., k], values [..., k]) most likely first; ties go to the lower id (as jax.lax.top_k
    and argmax do). A partial selection, not a sort of the vocabulary: this runs on every scored row."""
    x = np.asarray(logprobs)
    rows = x.reshape(-1, x.shape[-1])
    k = min(k, rows.shape[-1])
    ids = rows.argmax(-1)[:, None] if k == 1 else None
    if k > 1:
        kth = -np.partition(-rows, k - 1, axis=-1)[:, k - 1:k]  # the k-th largest value per row
        ids = np.empty((len(rows), k), np.int64)
        for r, row in enumerate(rows):  # candidates (ties at the k-th value included), by value then id
            cand = np.flatnonzero(row >= kth[r])
            ids[r] = cand[np.lexsort((cand, -row[cand]))][:k]
    ids = ids.reshape(*x.shape[:-1], k)
    return ids, np.take_along_axis(x, ids, axis=-1)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, streamed (weights files are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def check_prompts(prompts: Sequence[Sequence[int]], vocab: int, max_context: int, max_new: int) -> None:
    """Raise ModelError for an empty prompt, an id outside the vocabulary or too long a request:
    the one prompt validation every engine and the server use."""
    if max_new < 1:
        raise ModelError(f"max_new_tokens must be >= 1, got {max_new}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ModelError(f"prompt {i} is empty")
        bad = [t for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise ModelError(f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {vocab})")
        if len(p) + max_new > max_context:
            raise ModelError(f"prompt {i} has {len(p)} tokens; with max_new_tokens {max_new} it "
                             f"exceeds the model's context of {max_context}")


# ---- records ------------------------------------------------------------------------------------
@dataclass
class Scored:
    """Teacher-forced result for one sequence of T tokens.

    logits [T, V] float32: row t is the distribution of token t+1 given tokens 0..t.
    taps [L, T, D] float32 or None: the residual stream after each layer.
    routing_margins [T] float32 or None (MoE models, with taps): at each position, the smallest gap over the
    MoE layers between the k-th and (k+1)-th router choice scores; a near-tie there lets rounding change
    the token's experts. routing_layers [M, T]: that gap at each of the M MoE layers; routing_experts
    [M, T, k]: the chosen experts' ids, ascending; routing_gaps [M, T] (experts forced: a routing replay): the
    largest choice score outside the forced set minus the smallest inside (<= 0: the router's own choice).
    """

    logits: np.ndarray
    taps: np.ndarray | None = None
    routing_margins: np.ndarray | None = None
    routing_layers: np.ndarray | None = None
    routing_experts: np.ndarray | None = None
    routing_gaps: np.ndarray | None = None


# Engine.score's forced experts may hold, for a token's whole row: FREE, the router's own top-k; OTHER, its k-th choice
# swapped for its (k+1)-th (the other side of a near-tie: evalsuite/compare/flip.py)
FREE_EXPERTS, OTHER_EXPERTS = -1, -2


@dataclass
class Forced:
    """One row teacher-forced along given tokens (or the reference's own greedy track): the one record
    type the comparator reads. token_logprobs [N]: the log-softmax of the given token at each position
    (NaN where unknown); top_ids / top_logprobs [N, k]: the k most likely ids, most likely first
    (-1 / NaN where a server gave fewer); logits [N, V] only from engines with full logits; routing [M, P + N - 1,
    k] only from forced_routing: the experts (ascending) each MoE layer chose for each token the path fed."""

    token_logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    logits: np.ndarray | None = None
    routing: np.ndarray | None = None

    @classmethod
    def from_logits(cls, logits: np.ndarray, tokens: Sequence[int], k: int, keep_logits: bool = True) -> Forced:
        lp = log_softmax(logits)
        ids, vals = top_k(lp, k)
        tok = lp[np.arange(len(tokens)), np.asarray(tokens, np.int64)] if len(tokens) else np.zeros(0)
        return cls(tok, ids, vals, np.asarray(logits, np.float32) if keep_logits else None)


@dataclass
class Generation:
    """Greedy continuation of one prompt. token_ids: generated ids (a stop id, when hit, is included and ends the
    list). top_ids, top_logprobs [N, k]: the k most likely ids at each generated position and their log-softmax
    values of the float32 logits, most likely first. logits [N, V] when asked for."""

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
    # the number of tokens the server says it generated (`usage.completion_tokens`), where it says; else None
    counted: int | None = None
    # the number of prompt tokens the server says it read, where that differs from prompt_ids (a text-only server
    # whose tokenizer splits this prompt otherwise): its tokens are then not comparable, only its text
    prompt_counted: int | None = None

    def track(self) -> Forced:
        """The generation as a Forced record along its own tokens (greedy: the token is the top-1)."""
        if self.logits is not None:
            return Forced.from_logits(self.logits, self.token_ids, self.top_ids.shape[-1])
        return Forced(np.asarray(self.top_logprobs, np.float64)[:, 0], np.asarray(self.top_ids),
                      np.asarray(self.top_logprobs, np.float64))


# ---- which code paths ran ------------------------------------------------------------------------
# The paths of a batched, continuously batching engine that a check must drive to claim them checked (a bug
# in one is invisible to every prompt that does not take it). Engines declare the ones they have
# (Engine.paths); engines/loop.py and the engine's own steps record each one as it runs (PathLog).
PATHS = {
    "prefill_split": "an admission of prompts prefilled in two or more calls (long prompts past the prefill "
                     "token budget)",
    "refill": "a prompt prefilled into a live batch (continuous batching)",
    "refill_group": "two or more prompts prefilled into a live batch at once",
    "shrink": "the batch shrank to its live rows",
    "finish_mid_batch": "a row finished (stop id, stop check or budget) while others decoded on",
    "stop": "a row ended by a stop id or stop check, not its token budget",
    "shared_prefix": "a prefix every prompt of a call shares, prefilled once and reused",
    "shared_prefix_unaligned": "a shared prefix whose length is not a power of two",
    "multi_tile": "a decode step's attention over two or more cache tiles",
    "teacher_forced": "tokens fed by decode steps along given continuations",
    "spec_accept_all": "a speculative verify step that accepted every draft (the bonus token from its last row)",
    "spec_reject_first": "a speculative verify step that rejected the first draft (rolled back to the anchor)",
    "spec_partial": "a speculative verify step that accepted some drafts and rejected the rest (a rollback mid-block)",
}


@dataclass
class PathLog:
    """Which of an engine's code paths ran (names of PATHS, counted) and the shapes its steps took (e.g.
    "decode_window" -> {128, 256}): what a check can say it drove, reported by the engine itself."""

    counts: dict[str, int] = field(default_factory=dict)
    shapes: dict[str, set] = field(default_factory=dict)

    def hit(self, name: str, n: int = 1) -> None:
        assert name in PATHS, name
        self.counts[name] = self.counts.get(name, 0) + n

    def shape(self, name: str, value: int) -> None:
        self.shapes.setdefault(name, set()).add(int(value))

    def snapshot(self) -> dict:
        """{"counts": {path: n}, "shapes": {name: sorted values}} (a copy)."""
        return {"counts": dict(self.counts), "shapes": {k: sorted(v) for k, v in self.shapes.items()}}


# ---- what an engine can show ----------------------------------------------------------------------
@dataclass(frozen=True)
class Capabilities:
    """What an engine can show, typed and frozen. A check that needs something false here reports it as
    "not checked" (and, where it is listed in `blocking`/`forced_blocking`, cannot PASS)."""

    logits: bool = False  # full-vocabulary logits: score(), generate(want_logits=True), forced_topk(want_logits=True)
    taps: bool = False  # score(want_taps=True) and step_taps(): per-layer residual streams (bisection)
    gen_logprobs: bool = True  # generate's top_logprobs are the engine's (else NaN)
    forced: bool = True  # forced_topk works; else it raises saying why (forced_refusal)
    forced_path: str = "decode"  # what forced_topk scores with: "decode", "prefill" or "unstated"
    forced_refusal: str = ""  # why forced_topk is unavailable, in one line
    stop_strings: bool = False  # generate(stop_strings=...) is honoured by the engine itself
    runs_past_eos: bool = True  # generate without stop ids runs past end-of-turn (a server may not)
    routing: bool = False  # forced_routing(): the experts its MoE layers chose along a forced path (a routing replay)
    blocking: tuple[str, ...] = ()  # could not be shown about this engine: no PASS over it
    forced_blocking: tuple[str, ...] = ()  # could not be shown about forced_topk: no PASS of checks using it
    notes: tuple[str, ...] = ()  # said in results, blocks nothing
    findings: tuple[tuple[str, bool | None, str], ...] = ()  # (name, ok, how it was established)

    def not_checked(self, uses_forced: bool) -> list[str]:
        """What blocks a PASS of a check over this engine (that uses forced_topk or not)."""
        return list(self.blocking) + (list(self.forced_blocking) if uses_forced else [])

    def report(self) -> dict:
        """For result files (`engine_capabilities`): each finding's ok and detail."""
        if self.findings:
            return {n: {"ok": ok, "detail": d} for n, ok, d in self.findings}
        flags = {"logits": self.logits, "taps": self.taps, "gen_logprobs": self.gen_logprobs,
                 "forced": self.forced, "stop_strings": self.stop_strings}
        return {n: {"ok": v, "detail": "declared by the engine"} for n, v in flags.items()} | {
            "forced_path": {"ok": True, "detail": self.forced_path}}


@dataclass(frozen=True)
class EngineOptions:
    """How the user asked for an engine: its precision mode, a fault (self-test aid) and its own settings
    (--engine-option KEY=VALUE; for a server engine also where the server is: base_url and its companions)."""

    dtype: str = "float32"
    fault: str | None = None
    extra: dict = field(default_factory=dict)


def flag_option(extra: dict, key: str) -> bool:
    """A boolean --engine-option (KEY=1/true/yes/on or 0/false/no/off; absent: False)."""
    v = str(extra.get(key, "0")).strip().lower()
    if v not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ModelError(f"--engine-option {key}={extra[key]!r}: expected 1/true/yes/on or 0/false/no/off")
    return v in ("1", "true", "yes", "on")


class Engine(abc.ABC):
    """Subclass this to plug an engine in (see examples/numpy-engine). Set name, config, dtype,
    weights_sha256 and capabilities in __init__; implement create, fingerprint, generate, forced_topk."""

    faults: ClassVar[tuple[str, ...]] = ()  # fault names create() accepts (CLI --fault choices)
    options: ClassVar[tuple[str, ...]] = ()  # --engine-option keys create() reads from EngineOptions.extra
    takes_remote: ClassVar[bool] = False  # a server client: create() needs options.extra["base_url"]
    # why the engine has no float32 build of its own to judge beside a bf16 run (a server runs in its own dtype; the
    # reference's float32 build is the judge), empty where create(dtype="float32") builds one
    no_float32_build: ClassVar[str] = ""
    # why this engine's numbers are its own (quantised weights, another build of the model), said by the engine or
    # its user: a run then reports its token parity with the judge instead of judging it. Empty: it claims the judge's
    # model and, in its dtype, the judge's numerics, so a real mismatch is a bug.
    own_numerics: str = ""
    name: str
    config: Config
    dtype: str
    weights_sha256: str | None
    capabilities: Capabilities
    max_batch: int = 8  # rows per call that evalsuite sends at once
    # True: generate() takes on_result(i, Generation), called as prompt i finishes; evalsuite then hands
    # it a whole task's prompts in one call (the engine batches them as it likes: continuous batching)
    # and journals each answer as it comes. False: evalsuite sends max_batch prompts per call.
    streams_results: ClassVar[bool] = False
    # bfloat16 mode's numeric recipe (Recipe): None, undeclared, and a bf16 check then compares the engine with
    # float32 and the reference's default recipe only
    recipe: Recipe | None = None
    # the PATHS this engine has; each one it records in path_log() as it runs. () : it reports none (a server,
    # a plugin that does not say), and checks then say which of its paths ran is unknown
    paths: ClassVar[tuple[str, ...]] = ()

    def run_notes(self) -> list[str]:
        """What blocks a PASS that the engine found while running (a server: prompts it read otherwise); [] by
        default."""
        return []

    @classmethod
    def fault_catalogue(cls) -> list[dict]:
        """One row per name in `faults` for a fault table (docs/faults.md): name, what (the faulted engine does),
        stands_for (the real bug), shows_with (what a run needs to show it); empty where an engine says nothing."""
        return [{"name": n, "what": "", "stands_for": "", "shows_with": ""} for n in cls.faults]

    @classmethod
    @abc.abstractmethod
    def create(cls, model, options: EngineOptions) -> Engine:
        """Build the engine for a loaded model (evalsuite.models.Model: name, weights, tokenizer, config)."""

    @property
    @abc.abstractmethod
    def fingerprint(self) -> str:
        """What the engine IS, for reuse decisions: a change to it must change this string."""

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                 top_k: int = 5, want_logits: bool = False, stop_check: StopCheck | None = None,
                 stop_strings: Sequence[str] = ()) -> list[Generation]: ...

    @abc.abstractmethod
    def forced_topk(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int = 5,
                    want_logits: bool = False) -> list[Forced]:
        """Per row, continuation[j] scored from prompt + continuation[:j] by the engine's decode path."""

    def score_topk(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                   k: int = 5) -> list[Forced]:
        """Per row, continuation[j] scored from prompt + continuation[:j] in one teacher-forced forward pass (the
        prefill path): how a judge scores another engine's whole answer for about the cost of a prefill. top-k, no
        full logits. Default: forced_topk (the decode path: the same records at a decode step a token)."""
        return self.forced_topk(prompts, continuations, k)

    def canary_logprobs(self) -> list[float] | None:
        """Values a resumed run compares with the journal's, within canary_tol, before reusing its answers (a
        server's: a prompt cache moves them slightly, so no hash). None: the fingerprint alone decides."""
        return None

    canary_tol: ClassVar[float] = 0.0  # the largest |Δ| between two canary_logprobs() of the same engine

    def placement(self) -> dict | None:
        """Where the weights live when split over devices or processes (for result files): the mesh's axis sizes
        and the weight bytes this process holds against the whole. None: one device."""
        return None

    def path_log(self) -> PathLog | None:
        """The paths this engine ran since it was built (PATHS), or None: it does not report them."""
        return None

    def run_stats(self) -> dict:
        """Figures the engine measured about itself since it was built (a speculative engine: its acceptance length
        and rates); {} where it has none. Reported, never judged."""
        return {}

    def self_checks(self) -> list[dict]:
        """Checks the engine ran on itself since it was built (the megakernel in TPU interpret mode: the race
        detector), each {"name", "ok", "detail"}; [] where it runs none. A check not ok FAILs a diff."""
        return []

    def score(self, seqs: Sequence[Sequence[int]], want_taps: bool = False) -> list[Scored]:
        raise ModelError(f"engine {self.name} offers no full-vocabulary logits")

    def forced_routing(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int = 5,
                       want_logits: bool = False) -> list[Forced]:
        """forced_topk's records with Forced.routing: the experts each MoE layer chose for every token the path fed
        (the prompt's P, then continuation[:-1]), from the same run as the logits."""
        raise ModelError(f"engine {self.name} does not report its expert choices")

    def step_taps(self, prompts: Sequence[Sequence[int]], next_ids: Sequence[int], decoded: int = 0) -> np.ndarray:
        """[rows, L, D]: the residual stream after each layer at one decode step on next_ids after prompts; the
        last `decoded` tokens of each prompt are fed by decode steps first (so the cache they read was written
        by the decode path, as in generation), the rest prefilled."""
        raise ModelError(f"engine {self.name} offers no per-layer taps")

"""A speculative-decoding engine: a drafter proposes T-1 tokens a row, the target verifies the anchor and the drafts
in one multi-token step, and greedy acceptance commits the leading drafts equal to the target's argmax plus the
bonus token (the target's argmax after the last accepted one). Under greedy decoding its stream must be the
target's own, token for token, whatever the drafter proposes: that is what `evalsuite diff` checks of it.

Engine options (--engine-option KEY=VALUE):
  target   what verifies a block: "reference" (the reference model's forward pass over the block: the speculation is
           what is judged, not the model's math) or "megakernel" (its decode kernel taking the whole block in one
           call, engines.megakernel.verify: the fused engine's verify step and the speculation judged together)
  drafter  ngram (default), layers:N, oracle, random, sweep (engines.spec.drafters)
  block    T, the tokens a verify step takes a row: the anchor and T-1 drafts (default 4)
  seed     the random drafter's seed (default 0)
  interpret, chip, kv_cache, experts, mla, residual, rounds  the megakernel target's own (engines.megakernel)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from engines.base import (
    Capabilities,
    Engine,
    EngineOptions,
    Forced,
    Generation,
    PathLog,
    check_prompts,
    next_pow2,
    source_fingerprint,
)
from engines.errors import ModelError
from engines.megakernel.verify import VERIFY_FAULTS
from engines.reference import ReferenceEngine
from engines.spec import drafters
from engines.spec.target import KernelRunner, Runner
from engines.weights import Weights, expected_shapes

# what verifies a block: the reference's forward pass over T tokens at once, or one call of the megakernel's decode
# kernel over the T tokens
TARGETS = ("reference", "megakernel")
DEFAULT_BLOCK = 4  # the anchor + 3 drafts: every acceptance length 0..3 in a sweep of 4 rounds
MAX_BLOCK = 16
MAX_BATCH = 8
# (name, what the faulted engine does, the real bug it stands for, what a run needs to show it)
FAULTS = (
    ("accept_extra", "commits one draft past the first rejected one", "an off-by-one in the accept count (the "
     "first mismatch counted as a match)", "any rejection: random or sweep drafts"),
    ("bonus_row", "takes the bonus token from the row after the last accepted one", "the bonus token read from the "
     "wrong row of the verify logits", "any rejection: random or sweep drafts"),
    ("no_rollback", "keeps the whole block in the cache after a rejection: the next block starts after the rejected "
     "drafts, and a recurrent state keeps them", "the KV length / GDN-KDA state not rolled back", "any rejection"),
    ("draft_offset", "feeds the drafts one position too far (a gap after the anchor)", "draft positions off by one "
     "in the verify step", "accepted drafts: oracle or sweep drafts"),
    ("block_mask", VERIFY_FAULTS["block_mask_ahead"][1], VERIFY_FAULTS["block_mask_ahead"][2],
     "target=megakernel (the kernel's verify step), any drafts"),
)
KERNEL_FAULTS = {"block_mask": "block_mask_ahead"}  # faults inside the megakernel's verify step
# passed to the megakernel target (its bf16 recipe's kv_cache, residual and rounds among them: the judge runs it)
TARGET_OPTIONS = ("interpret", "chip", "kv_cache", "experts", "mla", "residual", "rounds")


@dataclass
class Stats:
    """What the engine measured about its own speculation since it was built."""

    block: int
    rounds: int = 0  # a live row's verify step (one target step for that row)
    committed: int = 0  # tokens committed by those rounds (accepted drafts + bonus tokens, before stops cut them)
    accepted_at: list = field(default_factory=list)  # [T-1]: rounds whose draft i was accepted
    acc_hist: list = field(default_factory=list)  # [T]: rounds that accepted 0..T-1 drafts
    rollbacks: int = 0  # rows whose recurrent state was rolled back after a rejection

    def report(self) -> dict:
        r = max(self.rounds, 1)
        return {"block": self.block, "target_steps": self.rounds, "tokens_committed": self.committed,
                "acceptance_length": round(self.committed / r, 4) if self.rounds else None,
                "acceptance_rate_by_position": [round(a / r, 4) for a in self.accepted_at] if self.rounds else None,
                "accepted_drafts_histogram": list(self.acc_hist),
                "target_steps_saved": self.committed - self.rounds, "recurrent_rollbacks": self.rollbacks,
                "what": "acceptance_length: tokens committed per target step per row (plain decoding: 1); "
                        "acceptance_rate_by_position[i]: the share of steps whose draft i+1 was accepted"}


def truncated(weights: Weights, n: int) -> Weights:
    """The model's first n layers with its embedding, final norm and LM head: a self-speculative draft model."""
    c = weights.config
    if not 1 <= n < c.n_layers:
        raise ModelError(f"--engine-option drafter=layers:{n}: {c.name} has {c.n_layers} layers; "
                         f"use 1..{c.n_layers - 1}")
    kinds = c.layer_kinds[:n] if c.layer_kinds else c.layer_kinds
    family = "dense" if c.family == "dense" or n <= c.first_dense else c.family  # only dense layers left: dense
    try:
        sub = replace(c, name=f"{c.name}[:{n}]", n_layers=n, layer_kinds=kinds, family=family)
    except ValueError as e:
        raise ModelError(f"--engine-option drafter=layers:{n}: the first {n} layers of {c.name} are no model: {e}") \
            from None
    shapes = expected_shapes(sub)
    arrays = {k: (np.asarray(weights.arrays[k])[:shapes[k][0]] if np.ndim(weights.arrays[k]) > 1
                  and shapes[k] != weights.shape(k) else weights.arrays[k]) for k in shapes}
    return Weights(sub, arrays, f"{weights.sha256}:layers[:{n}]", weights.source)


class SpeculativeEngine(Engine):
    faults = tuple(f[0] for f in FAULTS)
    options = ("target", "drafter", "block", "seed", *TARGET_OPTIONS)
    streams_results = True
    max_batch = MAX_BATCH
    paths = ("spec_accept_all", "spec_reject_first", "spec_partial", "refill", "finish_mid_batch", "stop")

    @classmethod
    def fault_catalogue(cls) -> list[dict]:
        return [{"name": n, "what": w, "stands_for": s, "shows_with": h} for n, w, s, h in FAULTS]

    @classmethod
    def create(cls, model, options: EngineOptions) -> SpeculativeEngine:
        x = options.extra
        return cls(model.weights, options.dtype, fault=options.fault, target=str(x.get("target") or "reference"),
                   drafter=str(x.get("drafter") or "ngram"), block=_int(x, "block", DEFAULT_BLOCK),
                   seed=_int(x, "seed", 0), kernel={k: str(x[k]) for k in TARGET_OPTIONS if x.get(k)})

    def __init__(self, weights: Weights, dtype: str = "float32", fault: str | None = None, target: str = "reference",
                 drafter: str = "ngram", block: int = DEFAULT_BLOCK, seed: int = 0, kernel: dict | None = None):
        """kernel: the megakernel target's own options (TARGET_OPTIONS)."""
        if target not in TARGETS:
            raise ModelError(f"--engine-option target={target!r}: expected one of {', '.join(TARGETS)}")
        if not 2 <= block <= MAX_BLOCK:
            raise ModelError(f"--engine-option block={block}: expected 2..{MAX_BLOCK} (the anchor and 1+ drafts)")
        if fault is not None and fault not in self.faults:
            raise ModelError(f"unknown fault {fault!r} for engine spec; expected one of {', '.join(self.faults)}")
        kind, n = drafters.parse(drafter)
        self.name, self.config, self.dtype, self.fault = "spec", weights.config, dtype, fault
        self.weights_sha256 = weights.sha256
        self.block, self.seed, self.drafter_kind, self.target_name = block, seed, drafter, target
        if fault in KERNEL_FAULTS and target != "megakernel":
            raise ModelError(f"fault {fault} is in the megakernel's verify step: --engine-option target=megakernel")
        if kernel and target != "megakernel":
            raise ModelError(f"--engine-option {next(iter(kernel))} is the megakernel target's: add "
                             "--engine-option target=megakernel")
        if target == "megakernel":
            from engines.megakernel import MegakernelEngine

            self.target = MegakernelEngine(weights, dtype, verify_fault=KERNEL_FAULTS.get(fault), **(kernel or {}))
            self._run = KernelRunner(self.target)
        else:
            self.target = ReferenceEngine(weights, dtype)
            self._run = Runner(self.target)
        self.recipe = self.target.recipe
        self._draft_weights = truncated(weights, n) if kind == "layers" else None
        self._kind = kind
        self.capabilities = Capabilities(
            logits=True, taps=True, forced_path="decode",
            notes=("forced_topk and score are the target's own (a teacher-forced pass drafts nothing); generate and "
                   "step_taps are the speculative path (step_taps: a verify step's anchor row)",))
        self.stats = Stats(block, accepted_at=[0] * (block - 1), acc_hist=[0] * block)
        self._paths = PathLog()

    @property
    def fingerprint(self) -> str:
        from pathlib import Path

        return source_fingerprint(Path(__file__).parent, {"dtype": self.dtype, "fault": self.fault, "block": self.block,
                                                          "drafter": self.drafter_kind, "seed": self.seed,
                                                          "target": self.target.fingerprint})

    def path_log(self) -> PathLog:
        return self._paths

    def run_stats(self) -> dict:
        return {"speculation": {"drafter": self.drafter_kind, "target": self.target_name, **self.stats.report()}}

    def forced_topk(self, prompts, continuations, k=5, want_logits=False) -> list[Forced]:
        return self.target.forced_topk(prompts, continuations, k, want_logits)

    def score(self, seqs, want_taps=False):
        return self.target.score(seqs, want_taps)

    def step_taps(self, prompts, next_ids, decoded: int = 0) -> np.ndarray:
        """[rows, L, D] at next_ids after prompts, from a verify step of T tokens (next_ids as its anchor, the drafts
        after it unseen by the anchor's row); the last `decoded` prompt tokens reach the cache through verify steps
        of T as well (every draft accepted), the rest by prefill: the cache the speculative path writes."""
        T, out = self.block, []
        for p, nxt in zip(prompts, next_ids):
            p = [int(t) for t in p]
            cut = len(p) - min(decoded, len(p) - 1)
            slots = next_pow2(len(p) + 2 * T, 128)
            *_, state = self._run.prefill(p[:cut], slots, 1, False)
            pos = cut
            for j in range(cut, len(p), T):  # the decoded tail, a full block at a time (padding past its end)
                chunk = p[j:j + T]
                tokens = np.array([chunk + [chunk[-1]] * (T - len(chunk))])
                state = self._run.feed(state, tokens, pos + np.arange(T)[None], np.array([len(chunk)]), 1, False)[-1]
                pos += len(chunk)
            out.append(self._run.anchor_taps(state, np.full((1, T), int(nxt)), pos + np.arange(T)[None])[0])
        return np.stack(out)

    def _drafter(self, batch: int, slots: int) -> drafters.Drafter:
        V = self.config.vocab_size
        if self._kind == "ngram":
            return drafters.NgramDrafter()
        if self._kind == "random":
            return drafters.RandomDrafter(V, self.seed)
        if self._kind in ("oracle", "sweep"):
            return drafters.OracleDrafter(V, sweep=self._kind == "sweep")
        return drafters.ModelDrafter(Runner(ReferenceEngine(self._draft_weights, self.dtype)), self.drafter_kind,
                                     batch, slots)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                 top_k: int = 5, want_logits: bool = False, stop_check=None, stop_strings: Sequence[str] = (),
                 on_result=None) -> list[Generation]:
        from engines.spec.loop import speculate

        c = self.config
        check_prompts(prompts, c.vocab_size, c.max_context - self.block, max_new_tokens)
        if not 1 <= top_k <= c.vocab_size:
            raise ModelError(f"top_k must be in [1, {c.vocab_size}], got {top_k}")
        if not prompts:
            return []
        B = next_pow2(min(len(prompts), MAX_BATCH))
        slots = next_pow2(max(len(p) for p in prompts) + max_new_tokens + 2 * self.block + 2, 128)
        draft = self._drafter(B, slots)
        if draft.needs_oracle:  # the target's plain greedy stream, by its own decode path
            plain = self.target.generate(prompts, max_new_tokens, stop_ids, 1, stop_check=stop_check)
            draft.set_oracle({tuple(int(t) for t in p): g.token_ids for p, g in zip(prompts, plain)})
        return speculate(self, draft, prompts, max_new_tokens, set(int(s) for s in stop_ids), top_k, want_logits,
                         stop_check, on_result, B, slots)


def _int(extra: dict, key: str, default: int) -> int:
    v = extra.get(key)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ModelError(f"--engine-option {key}={v!r}: expected a whole number") from None

"""lm-eval model adapter over the engine protocol (a TemplateLM subclass).

Registered as `evalsuite` (`--model_args engine=NAME,...`) and as evalsuite-NAME for every installed
engine (evalsuite-reference, evalsuite-megakernel, evalsuite-openai with base_url=URL, and every
plugin): `--model_args model=smollm2-135m,dtype=float32,fault=...`. Greedy only: a request asking for
sampling is refused, never silently decoded greedily.

- loglikelihood: per (context, continuation), the engine teacher-forced along the continuation
  (`forced_topk`, the protocol's decode-path scoring: all but the last context token prefilled, every
  continuation token scored by a decode step, so for the megakernel by the kernel; over HTTP: echo).
  is_greedy is whether every continuation token is the top-1 at its position.
- loglikelihood_rolling: disjoint windows of max_length tokens (lm-eval's own window helper).
- generate_until: batched greedy generation (engine.generate); a row stops generating once its text
  holds a stop string and is cut there. The reference prefills a few-shot prefix shared by a batch
  once and reuses its KV cache (engines.loop). The bars show a running accuracy (bench.live).
  With `answers` (the judge in `run`'s scoring mode) the judge does not decode: it scores the engine's
  answer to each request in one teacher-forced pass and decodes only from where its greedy answer
  parts from the engine's (bench.scoring). Every journaled answer keeps its token ids and its top-k
  logprobs per position, which the parity part of `run` compares.
"""

from __future__ import annotations

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from evalsuite.errors import SpecError
from evalsuite.roles import JUDGE
from evalsuite.stops import cut_at_stop, stop_check, visible_text

DEFAULT_MAX_GEN_TOKS = 256
DEFAULT_MAX_LENGTH = 2048
# Part of every journal key: bump it when a cached result's meaning changes, so old journals are
# not reused. 2: loglikelihood scored the continuation shifted by one before.
# 3: keys hold the engine's fingerprint (its source, jax versions and static spec; for a server,
# its reported identity and a canary), so a changed engine never reuses answers. 4: a server's model id
# is keyed through its fingerprint (engines/base.py protocol), not read off the client object.
# 5: a generated answer's record holds its token ids and top-k logprobs (the judge scores them).
ADAPTER_VERSION = 5
PARITY_TOPK = 5  # top-k logprobs asked of every generated position: every rank the parity part compares


class EngineLM(TemplateLM):
    engine_name = JUDGE

    def __init__(self, model: str = "smollm2-135m", dtype: str = "float32", fault: str | None = None,
                 max_length: int = DEFAULT_MAX_LENGTH, batch_size: int | str | None = None,
                 journal: str | None = None, progress: bool = True, base_url: str | None = None,
                 served_model: str | None = None, api_key_env: str | None = None,
                 engine: str | None = None, built=None, shard: tuple[int, int] | None = None,
                 answers=None, **kwargs):
        """shard (i, N): only the docs with doc_id % N == i are computed; lm-eval still builds every doc's
        request (so each doc's few-shot exemplars, drawn from one seeded sequence, are those of an unsharded
        run) and the others get placeholders, which evalsuite.bench.run drops from the records.
        answers(ctx, gen_kwargs) -> dict | None: another engine's journaled answer to a generate_until request;
        given, this engine judges those answers (bench.scoring) instead of decoding every token itself."""
        super().__init__()
        self.answers = answers
        self.shard = shard
        self.engine_name = engine or self.engine_name
        self.journal = None
        self.live = None  # the progress bar's running tally (bench.live), kept for the result file
        self._ll_docs = None  # per loglikelihood request (doc, doc id, choice index, choices), for the tally
        self.progress = progress
        from evalsuite.models import load_model
        from evalsuite.plugins import make_engine

        self.model = load_model(model)
        if self.model.tokenizer is None:
            raise SpecError(f"model {model} has no tokenizer: lm-eval tasks need one")
        server = {k: v for k, v in (("base_url", base_url), ("served_model", served_model),
                                    ("api_key_env", api_key_env)) if v}  # a server engine's options
        # built: the engine, already made by the caller (evalsuite run probes it first)
        self.engine = built if built is not None else make_engine(self.engine_name, self.model, dtype, fault or None,
                                                                  server)
        self.max_length = min(int(max_length), self.model.config.max_context)
        # default: the engine's rows per device call (reference 32, megakernel 8): the journal is
        # written after each call's requests, so a bigger batch would only delay it
        default = self.engine.max_batch
        self.gen_batch = int(batch_size) if str(batch_size).isdigit() and int(batch_size) > 0 else default
        self.identity = {"engine": self.engine_name, "model": model, "weights_sha256": self.model.weights.sha256,
                         "dtype": dtype, "fault": fault or None, "max_length": self.max_length,
                         "adapter_version": ADAPTER_VERSION, "engine_fingerprint": self.engine.fingerprint,
                         "scores_answers": answers is not None}
        if base_url:  # the server is part of the identity (never the API key); its model id is in the fingerprint
            self.identity.update(base_url=base_url)
        if journal:
            from evalsuite.bench.journal import Journal

            self.journal = Journal(journal)
            self._check_canary()

    def _check_canary(self) -> None:
        """A server's canary logprobs (taken at start) must match those of the run that wrote the
        journal within the engine's canary_tol, or its answers are not reused: it is not the same engine."""
        from evalsuite.bench.journal import request_key

        tol = self.engine.canary_tol

        key = request_key(self.identity, "canary", [])
        now = self.engine.canary_logprobs()
        if now is None:  # an in-process engine: its fingerprint alone decides
            return
        have = self.journal.get(key)
        if have is None:
            self.journal.add([{"key": key, "kind": "canary", "result": now}])
            return
        before = have["result"]
        d = max((abs(a - b) for a, b in zip(now, before)), default=0.0) if len(now) == len(before) else float("inf")
        if d > tol:
            self.journal.close()
            raise SpecError(f"the engine ({self.identity.get('base_url') or self.engine_name}) answers the canary "
                            f"differently from when "
                            f"{self.journal.path} was written (max |Δlogprob| {d:.3g} > {tol}): not the same "
                            "engine, so its answers are not reused; use a new --output or delete that journal")

    # ---- tokenization -----------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.model.tokenizer.eos_ids[0]

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # --model's tokenizer for every engine: both engines of a run see the same token ids (a server
        # that takes text prompts has each one's tokenization checked by the client)
        return self.model.tokenizer.encode(string)

    def tok_decode(self, ids) -> str:
        return self.model.tokenizer.decode(list(ids))

    @property
    def tokenizer_name(self) -> str:
        return f"evalsuite:{self.model.name}"

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        return self.model.tokenizer.render_chat(chat_history, add_generation_prompt)

    # ---- scoring ----------------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        # Keep each request's doc and choice index for the bar's running accuracy (TemplateLM hands
        # _loglikelihood_tokens only the token ids).
        from collections import Counter

        mine = [i for i, r in enumerate(requests) if self._mine(r)]
        requests_mine = [requests[i] for i in mine]
        ids = [(r.task_name, r.doc_id) for r in requests_mine]
        per_doc = Counter(ids)  # a doc's requests are its choices
        self._ll_docs = [(r.doc, d, r.idx, per_doc[d]) for r, d in zip(requests_mine, ids)]
        try:
            got = super().loglikelihood(requests_mine, disable_tqdm=disable_tqdm) if requests_mine else []
        finally:
            self._ll_docs = None
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)  # other shards' docs: placeholders
        for i, r in zip(mine, got):
            out[i] = r
        return out

    def _mine(self, request) -> bool:
        return self.shard is None or request.doc_id % self.shard[1] == self.shard[0]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        from evalsuite.bench.journal import request_key
        from evalsuite.bench.live import ChoiceTally

        out: list[tuple[float, bool]] = []
        docs = self._ll_docs
        docs = docs if docs is not None and len(docs) == len(requests) else None
        tally = self.live = ChoiceTally()
        bar = _bar(len(requests), "loglikelihood", self.progress and not disable_tqdm)
        # lm-eval hands the requests longest first, a question's choices side by side: each chunk of
        # gen_batch rows is one forced_topk call (the engine prefills a context its rows share once)
        for s in range(0, len(requests), self.gen_batch):
            chunk = requests[s:s + self.gen_batch]
            keys = [request_key(self.identity, "ll", [list(c), list(x)]) for _, c, x in chunk]
            hits = [self.journal.get(k) if self.journal else None for k in keys]
            todo = [i for i, h in enumerate(hits) if h is None]
            if todo:
                scored = self._score([(chunk[i][1], chunk[i][2]) for i in todo])
                new = [{"key": keys[i], "kind": "ll", "result": list(r)} for i, r in zip(todo, scored)]
                for i, h in zip(todo, new):
                    hits[i] = h
                if self.journal:
                    self.journal.add(new)
            for i, h in enumerate(hits):
                out.append((float(h["result"][0]), bool(h["result"][1])))
                if docs is not None:
                    doc, doc_id, idx, n = docs[s + i]
                    tally.add_choice(doc, doc_id, idx, n, out[-1][0])
                    bar.set_postfix(tally.postfix(), refresh=False)
                bar.update(1)
        bar.close()
        return out

    def _score(self, pairs) -> list[tuple[float, bool]]:
        """(sum of continuation logprobs, greedy) per (context, continuation), in one forced_topk call."""
        prompts, conts = [], []
        for context_enc, continuation_enc in pairs:
            seq = (list(context_enc) + list(continuation_enc))[-(self.max_length + 1):]
            n = len(continuation_enc)
            if len(seq) <= n:
                raise SpecError(f"a continuation of {n} tokens leaves no context within max_length {self.max_length}")
            prompts.append(seq[:-n])
            conts.append(seq[-n:])
        forced = self.engine.forced_topk(prompts, conts, 1)
        return [(float(np.sum(f.token_logprobs)), bool((f.top_ids[:, 0] == np.asarray(x)).all()))
                for f, x in zip(forced, conts)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in [r.args for r in requests]:
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(ll for ll, _ in self._loglikelihood_tokens([(None, c, t) for c, t in windows]))
            out.append(total)
        return out

    # ---- generation -------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if self.shard is not None:  # other shards' docs: placeholders, never computed or journaled
            mine = [i for i, r in enumerate(requests) if self._mine(r)]
            got = self._generate([requests[i] for i in mine], disable_tqdm) if mine else []
            out = [""] * len(requests)
            for i, text in zip(mine, got):
                out[i] = text
            return out
        return self._generate(requests, disable_tqdm)

    def _generate(self, requests, disable_tqdm: bool) -> list[str]:
        from evalsuite.bench.journal import request_key
        from evalsuite.bench.live import Tally, judge_generation

        args = [r.args for r in requests]
        docs = [r.doc for r in requests]
        tally = self.live = Tally()
        out: list[str | None] = [None] * len(args)
        groups: dict[tuple, list[int]] = {}
        keys = []
        first: dict[str, int] = {}  # key -> the request that computes it
        repeats: dict[int, int] = {}  # request -> the earlier request with the same key
        theirs: dict[int, dict] = {}  # scoring mode: request -> the other engine's answer
        for i, (ctx, kw) in enumerate(args):
            until, max_toks, key = self.gen_request(ctx, kw)
            if self.answers is not None:
                theirs[i] = self._their_answer(ctx, kw)
                key = request_key(self.identity, "gen-scored", [key, theirs[i]["key"]])
            keys.append(key)
            hit = self.journal.get(keys[i]) if self.journal else None
            if hit is not None:
                out[i] = hit["result"]
                tally.add(judge_generation(docs[i], out[i]))
            elif keys[i] in first:  # the same request again (a task may repeat a prompt): computed once
                repeats[i] = first[keys[i]]
            else:
                first[keys[i]] = i
                groups.setdefault((tuple(until), max_toks), []).append(i)
        todo = sum(len(v) for v in groups.values())
        bar = _bar(len(args), "generate", self.progress and not disable_tqdm,
                   initial=len(args) - todo - len(repeats))
        bar.set_postfix(tally.postfix(), refresh=False)
        for (until, max_toks), idx in groups.items():
            # longest first: similar lengths share a batch, and the ETA is pessimistic, not optimistic
            idx = sorted(idx, key=lambda i: -len(args[i][0]))
            # an engine that streams its results (continuous batching) gets the whole group in one call and
            # each answer is journaled as it finishes; others get gen_batch prompts per call
            streams = bool(self.engine.streams_results) and self.answers is None
            step = len(idx) if streams else self.gen_batch
            for s in range(0, len(idx), step):
                chunk = idx[s:s + step]
                prompts = [self.request_prompt(*args[i]) for i in chunk]

                def done(j: int, g, chunk=chunk, until=until, extra=None) -> None:
                    i = chunk[j]
                    tok = self.model.tokenizer  # a server's own text where its ids are not its own (compare/text)
                    text = g.text if not g.ids_exact and g.text is not None else visible_text(tok, g.token_ids)
                    out[i], hit = cut_at_stop(text, until)
                    finish = "stop" if hit or g.finish_reason == "stop" else "length"
                    if self.journal:  # a server's own token count; the response without (stripped) special tokens
                        self.journal.add([{"key": keys[i], "kind": "gen", "result": out[i], "finish_reason": finish,
                                           "generated_tokens": len(g.token_ids) if g.counted is None else g.counted,
                                           "retokenized_tokens": len(g.token_ids), "raw": text,
                                           "response_plain": tok.decode(tok.encode(out[i]), skip_special=True),
                                           **_tokens_record(g), **(extra or {})}])
                    tally.add(judge_generation(docs[i], out[i]))
                    bar.set_postfix(tally.postfix(), refresh=False)
                    bar.update(1)

                check = stop_check(self.model.tokenizer, until)
                if self.answers is not None:  # the judge scores the engine's answers (bench.scoring)
                    self._score_answers(prompts, [theirs[i] for i in chunk], max_toks, check, done)
                    continue
                kw = {"on_result": done} if streams else {}
                gens = self.engine.generate(prompts, max_toks, stop_ids=self.model.tokenizer.eos_ids, top_k=PARITY_TOPK,
                                            stop_check=check, stop_strings=list(until), **kw)
                if not kw:
                    for j, g in enumerate(gens):
                        done(j, g)
        for i, j in repeats.items():
            out[i] = out[j]
            tally.add(judge_generation(docs[i], out[i]))
        bar.update(len(repeats))
        bar.close()
        return out


    def _their_answer(self, ctx: str, kw) -> dict:
        """The other engine's journaled answer to this request (scoring mode), with its token ids."""
        rec = self.answers(ctx, kw)
        if not rec or rec.get("token_ids") is None:
            raise SpecError("scoring mode: the engine under test has no journaled answer (with token ids) to a request "
                            "the judge was asked; run the engine first, or judge by decoding (--judge-decodes)")
        return rec

    def _score_answers(self, prompts, recs: list[dict], max_toks: int, check, done) -> None:
        """The judge's answers to one chunk of requests from the engine's (bench.scoring.judge_answers)."""
        from evalsuite.bench.scoring import Answer, judge_answers

        answers = [Answer(list(p), list(r["token_ids"]), r["finish_reason"], journal_array(r.get("top_ids"), np.int64),
                          journal_array(r.get("top_logprobs"), np.float64), bool(r.get("ids_exact", True)))
                   for p, r in zip(prompts, recs)]
        got = judge_answers(self.engine, answers, max_toks, self.model.tokenizer.eos_ids, check, PARITY_TOPK)
        for j, jd in enumerate(got):
            done(j, jd.generation, extra={"scored": jd.scored, "decoded": jd.decoded, "decoded_from": jd.decoded_from,
                                          "why": jd.why, "near_ties": jd.near_ties,
                                          "engine_answer_key": recs[j]["key"]})

    def gen_request(self, ctx: str, kw) -> tuple[list[str], int, str]:
        """(stop strings, max tokens, journal key) of one generate_until request."""
        from evalsuite.bench.journal import request_key

        kw = dict(kw or {})
        if kw.get("do_sample") or float(kw.get("temperature", 0.0) or 0.0) > 0:
            raise SpecError("evalsuite engines decode greedily only: the task asks for sampling")
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_toks = int(kw.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
        return until, max_toks, request_key(self.identity, "gen", [ctx, until, max_toks])

    def journal_record(self, ctx: str, kw) -> dict:
        """The journal's record of a generate_until request ({} when there is none): per-item facts
        (finish reason, generated tokens) come from the journal, the one record of what was done."""
        from evalsuite.bench.journal import request_key

        if self.journal is None:
            return {}
        key = self.gen_request(ctx, kw)[2]
        if self.answers is not None:  # scoring mode: keyed by the answer judged too
            theirs = self.answers(ctx, kw)
            if not theirs:
                return {}
            key = request_key(self.identity, "gen-scored", [key, theirs["key"]])
        return self.journal.get(key) or {}

    def request_prompt(self, ctx: str, kw) -> list[int]:
        """The prompt ids a generate_until request was decoded from (its context cut to fit its token budget)."""
        return self.tok_encode(ctx)[-(self.max_length - self.gen_request(ctx, kw)[1]):]


def _tokens_record(g) -> dict:
    """A generation's ids, top-k ids and logprobs (NaN: not given, as null) and whether the ids are the engine's."""
    lps = np.asarray(g.top_logprobs, np.float64)
    lps = lps.reshape(len(lps), -1) if lps.size else np.zeros((0, 1))  # an empty generation has no columns either
    return {"token_ids": [int(t) for t in g.token_ids], "top_ids": np.asarray(g.top_ids, np.int64).tolist(),
            "top_logprobs": [[None if np.isnan(v) else float(v) for v in row] for row in lps],
            "ids_exact": bool(g.ids_exact), "prompt_counted": g.prompt_counted}


def journal_array(rows, dtype) -> np.ndarray | None:
    """A journaled [n, k] list back to an array (null: NaN)."""
    if rows is None:
        return None
    if not rows:
        return np.zeros((0, 1), dtype)
    a = np.array([[np.nan if v is None else v for v in row] for row in rows], np.float64)
    return a.reshape(len(rows), -1).astype(dtype) if dtype is not np.float64 else a.reshape(len(rows), -1)


def _bar(total: int, desc: str, enabled: bool, initial: int = 0):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, unit="req", dynamic_ncols=True)


register_model("evalsuite")(EngineLM)  # --model_args engine=NAME,...


def _register_all() -> None:
    """evalsuite-NAME for every installed engine (plugins included)."""
    from evalsuite.plugins import names

    for name in names():
        cls = type(f"EngineLM_{name.replace('-', '_')}", (EngineLM,), {"engine_name": name})
        try:
            register_model(f"evalsuite-{name}")(cls)
        except (AssertionError, ValueError):  # already registered (module reloaded)
            pass


_register_all()

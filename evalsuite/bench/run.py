"""`evalsuite run gsm8k|gpqa`: the same items, prompts and greedy decoding through two engines via
lm-eval, then a paired per-item verdict (evalsuite.bench.stats) and, for generated answers, the parity part.

The engine under test runs first. By default the judge then scores its answers instead of decoding its own
(bench.scoring: one teacher-forced pass an answer, decoding only from where its greedy answer parts from the
engine's; `--judge-decodes` makes it decode every token). Either way every generated answer is compared with the
judge's greedy track position by position (the parity part): a real mismatch FAILs the run for an engine that
claims the judge's model and float32 numerics, and is reported for one that declares its own (Engine.own_numerics)
or runs in bfloat16 (diff judges that against its recipe)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.base import file_sha256
from evalsuite.bench import stats
from evalsuite.bench.data import BUNDLED, FEWSHOT, TASKS_DIR, Data, check_rows, load_rows, offline, resolve
from evalsuite.bench.parity import judge_work, parity_records, parity_summary
from evalsuite.errors import SpecError
from evalsuite.report import dumps, write_json
from evalsuite.results import RunResult
from evalsuite.roles import DEFAULT_ENGINE, JUDGE
from evalsuite.versions import versions

# task -> variant -> (lm-eval task name, YAML folder, primary filter, metric, chat template)
VARIANTS = {
    # gsm8k's primary filter is flexible-extract: a 135M model rarely writes "#### N" (strict-match
    # scored 0/20 on smollm2 where flexible found answers); both are recorded per item.
    "gsm8k": {"5shot": ("evalsuite_gsm8k", "gsm8k", "flexible-extract", "exact_match", False),
              "chat": ("evalsuite_gsm8k", "gsm8k", "flexible-extract", "exact_match", True),
              # lm-eval's gsm8k_cot: 8 fixed chain-of-thought exemplars, shared by every prompt
              "cot": ("evalsuite_gsm8k_cot", "gsm8k", "flexible-extract", "exact_match", False)},
    "gpqa": {"mc": ("evalsuite_gpqa_mc", "gpqa", "none", "acc", False),
             "cot": ("evalsuite_gpqa_cot", "gpqa", "flexible-extract", "exact_match", False)},
    # project-written items a 135M model gets right (tasks/make_sanity.py): where a broken engine
    # visibly loses accuracy, so every verdict path of `run` can be reached on real weights
    "sanity": {"gen": ("evalsuite_sanity", "sanity", "none", "exact_match", False),
               "mc": ("evalsuite_sanity_mc", "sanity", "none", "acc", False)},
}
DEFAULT_VARIANT = {"gsm8k": "5shot", "gpqa": "mc", "sanity": "gen"}
# lm-eval's simple_evaluate defaults: the few-shot sampler's (and numpy's, torch's) seed is 1234 and
# Python's random is seeded 0, so exemplars here are the ones `lm_eval --tasks gsm8k` draws
LM_EVAL_SEED = 1234
LM_EVAL_RANDOM_SEED = 0
REPEAT_NGRAM = 4  # repetition loop: share of repeated 4-grams in a response


@dataclass(frozen=True)
class RunSpec:
    task: str
    variant: str | None = None
    engine: str = DEFAULT_ENGINE
    against: str = JUDGE
    model: str = "smollm2-135m"
    limit: int | None = None
    data_dir: str | None = None
    output: str = "runs/latest"
    dtype: str = "float32"
    fault: str | None = None
    margin: float = stats.DEFAULT_MARGIN
    seed: int = LM_EVAL_SEED
    engine_options: tuple[tuple[str, str], ...] = ()  # --engine-option KEY=VALUE
    shard: str | None = None  # "i/N": only the items with doc_id % N == i (evalsuite merge combines the N)
    judge_decodes: bool = False  # the judge decodes every answer itself instead of scoring the engine's
    variant_option: str = "--variant"  # how the command that runs it names the variant (in its hints)

    def __post_init__(self):
        if self.shard is not None:
            m = re.fullmatch(r"(\d+)/(\d+)", self.shard)
            if not m or not int(m[1]) < int(m[2]):
                raise SpecError(f"--shard must be i/N with 0 <= i < N (e.g. 0/4), got {self.shard!r}")
        if self.task not in VARIANTS:
            raise SpecError(f"unknown task {self.task!r}; expected one of {', '.join(VARIANTS)}")
        v = self.variant or DEFAULT_VARIANT[self.task]
        if v not in VARIANTS[self.task]:
            raise SpecError(f"unknown variant {v!r} for {self.task}; expected one of {', '.join(VARIANTS[self.task])}")
        if not 0 < self.margin < 1:
            raise SpecError(f"--margin must be in (0, 1) (a share, e.g. 0.02), got {self.margin}")
        if self.limit is not None and self.limit < 1:
            raise SpecError(f"--limit must be >= 1, got {self.limit}")
        if self.against != JUDGE:
            raise SpecError(f"--against: only {JUDGE!r} is supported")

    @property
    def shard_of(self) -> tuple[int, int] | None:
        if self.shard is None:
            return None
        i, n = self.shard.split("/")
        return int(i), int(n)


def resolve_tasks(task: str, data: Data, out: Path) -> Path:
    """Copy the task YAMLs into the run folder, pointing data_files at the chosen data (and, for a
    few-shot task, its train split), written there as JSONL whatever the source format (parquet, CSV or
    JSONL in the hub schema)."""
    dst = out / "tasks"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(TASKS_DIR / VARIANTS[task][DEFAULT_VARIANT[task]][1], dst)
    swaps = {f"tasks/data/{BUNDLED[task].name}": (data.path, out / f"data-{task}.jsonl")}
    if task in FEWSHOT and data.fewshot is not None:
        swaps[f"tasks/data/{FEWSHOT[task].name}"] = (data.fewshot, out / f"data-{task}-fewshot.jsonl")
    for src, local in swaps.values():
        local.write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in load_rows(src)))
    for y in dst.glob("*.yaml"):
        text = y.read_text()
        for name, (_, local) in swaps.items():
            text = text.replace(name, str(local.resolve()))
        y.write_text(text)
    return dst


def repetition(text: str) -> float:
    """The share of repeated REPEAT_NGRAM-word n-grams in a response (a loop scores near 1)."""
    w = text.split()
    grams = [tuple(w[i:i + REPEAT_NGRAM]) for i in range(len(w) - REPEAT_NGRAM + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def release_memory() -> None:
    """Give an engine's freed memory back between the two runs of `run`: drop jax's compiled programs (the
    persistent cache makes them cheap to reload) and return freed heap to the OS (glibc's malloc_trim).
    Measured with one process holding the megakernel and running the reference, then the megakernel, on 32
    random prompts x 900 tokens + 64 new (smollm2): deleting the reference alone left RSS at 3.9
    GB and the megakernel's run peaked at 5.16 GB; with this, RSS fell to 1.56 GB and the peak stayed at the
    reference's 4.43 GB."""
    import ctypes
    import ctypes.util
    import gc

    import jax

    gc.collect()
    jax.clear_caches()
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc:
        try:
            ctypes.CDLL(libc).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl, macOS): the memory stays with the process
            pass


def run_engine(spec: RunSpec, engine: str, dtype: str, fault: str | None, tasks_dir: Path, out: Path,
               progress: Callable[[str], None], built=None, folder: str | None = None, answers=None):
    """One engine through lm-eval: (its per-item records and figures, the lm-eval adapter that ran it, each item's
    generate request (context, arguments) by doc_id). answers: the judge scores these (EngineLM's answers)."""
    offline()
    import lm_eval
    from lm_eval.tasks import TaskManager

    from evalsuite.bench.adapter import EngineLM

    name, _, primary, metric, chat = VARIANTS[spec.task][spec.variant or DEFAULT_VARIANT[spec.task]]
    progress(f"run: {spec.task} on {engine} ({dtype}, fault={fault})")
    eng_dir = out / (folder or engine)
    eng_dir.mkdir(parents=True, exist_ok=True)
    lm = EngineLM(engine=engine, model=spec.model, dtype=dtype, fault=fault, journal=str(eng_dir / "journal.jsonl"),
                  base_url=dict(spec.engine_options).get("base_url") if built is not None else None, built=built,
                  shard=spec.shard_of, answers=answers)
    try:
        res = lm_eval.simple_evaluate(model=lm, tasks=[name], limit=spec.limit, log_samples=True,
                                      task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
                                      apply_chat_template=chat, fewshot_as_multiturn=chat,
                                      random_seed=LM_EVAL_RANDOM_SEED, numpy_random_seed=spec.seed,
                                      torch_random_seed=spec.seed, fewshot_random_seed=spec.seed)
    finally:
        if lm.journal:
            lm.journal.close()
    samples = res.pop("samples")[name]
    write_json(eng_dir / "lm_eval_results.json", json.loads(json.dumps(res, default=str)))
    by_filter: dict[str, dict[int, dict]] = {}
    for s in samples:
        by_filter.setdefault(s.get("filter", "none"), {})[s["doc_id"]] = s
    records, requests = [], {}
    for doc_id, s in sorted(by_filter[primary].items()):
        if spec.shard_of is not None and doc_id % spec.shard_of[1] != spec.shard_of[0]:
            continue  # another shard's item: a placeholder, never computed
        prompt = s["arguments"][0][0] if s["arguments"] else ""
        gen = lm.journal_record(prompt, s["arguments"][0][1]) if isinstance(s["resps"][0][0], str) else {}
        if gen:
            requests[doc_id] = (prompt, s["arguments"][0][1])
        if isinstance(s["resps"][0][0], str):  # generation: the text and what the filter extracted
            resp, extracted = s["resps"][0][0], s["filtered_resps"][0] if s["filtered_resps"] else None
        else:  # multiple choice: per-choice loglikelihoods; the answer is the most likely choice
            lls = [float(r[0][0]) for r in s["resps"]]
            resp, extracted = json.dumps([round(x, 4) for x in lls]), "ABCDEFGH"[int(np.argmax(lls))]
        rec = {"doc_id": doc_id, "prompt_sha256": hashlib.sha256(str(prompt).encode()).hexdigest()[:16],
               "response": resp, "extracted": extracted,
               "target": s.get("target"), "correct": bool(s[metric] > 0.5),
               "finish_reason": gen.get("finish_reason", "n/a (loglikelihood)"),
               "generated_tokens": gen.get("generated_tokens"), "response_plain": gen.get("response_plain")}
        if "scored" in gen:  # the judge in scoring mode: what it scored and decoded itself
            rec |= {"scored_tokens": gen["scored"], "decoded_tokens": gen["decoded"],
                    "decoded_from": gen["decoded_from"], "scoring": gen["why"], "near_ties": gen.get("near_ties", 0)}
        for f, other in by_filter.items():
            rec[f"correct_{f}"] = bool(other[doc_id][metric] > 0.5)
        records.append(rec)
    with open(eng_dir / "records.jsonl", "w") as fh:
        fh.write("".join(dumps(r, ensure_ascii=False) + "\n" for r in records))
    if not records:
        raise SpecError(f"shard {spec.shard} holds no items (there are fewer items than shards)")
    live = lm.live  # the progress bar's running estimate, kept as a cross-check
    return {"records": records, "live_accuracy": live.right / live.seen if live is not None and live.seen else None,
            "lm_eval_results": str(eng_dir / "lm_eval_results.json"), "primary_filter": primary,
            "fingerprint": lm.engine.fingerprint, "adapter_version": lm.identity["adapter_version"]}, lm, requests


def gold_in_response(r: dict) -> bool:
    """GSM8K: the gold number appears in the response as a number of its own (an extraction miss when the
    answer was scored wrong)."""
    gold = str(r["target"]).split("####")[-1].strip()
    return bool(re.search(rf"(?<![0-9]){re.escape(gold)}(?![0-9])", r["response"] or ""))


def _failures(records: list[dict], task: str) -> dict:
    gen = [r for r in records if r["generated_tokens"] is not None]
    # an exported record (evalsuite/bench/export.py) carries these figures instead of the text they come from
    out = {"truncated_at_budget": sum(r["finish_reason"] == "length" for r in gen),
           "repetition_loops": sum((r["repetition"] if "repetition" in r else repetition(r["response"])) > 0.3
                                   for r in gen)}
    if task == "gsm8k":
        out["extraction_misses"] = sum(not r["correct"] and (r["gold_in_response"] if "gold_in_response" in r
                                                             else gold_in_response(r)) for r in gen)
        if all("correct_strict-match" in r for r in records):
            out["strict_vs_flexible_disagreements"] = sum(
                r["correct_strict-match"] != r["correct_flexible-extract"] for r in records)
    return out


def _settle(spec: RunSpec, v: stats.PairedVerdict, bundled: bool, n_items: int) -> str | None:
    """For an INCONCLUSIVE verdict: the command that could settle it."""
    if v.verdict != "INCONCLUSIVE":
        return None
    need = v.items_needed
    if spec.limit is not None and spec.limit < n_items and n_items >= need:
        return f"drop --limit (or raise it to >= {need}; the file holds {n_items} items)"
    if bundled:
        return (f"the bundled sample holds {n_items} items and PASS needs >= {need}: run on the full set, "
                f"`evalsuite run {spec.task} --data-dir DIR` (DIR holding the real {spec.task} files)")
    return f"the data holds {n_items} items and PASS needs >= {need} with b={v.b}: a larger set, or a wider --margin"


def _dataset(src, data: Path, bundled: bool, n_items: int, spec: RunSpec) -> dict:
    return {"path": str(data), "source": src.source, "origin": src.origin, "bundled_sample": bundled,
            "items_in_file": n_items, "sha256": file_sha256(data),
            "fewshot": None if src.fewshot is None else {
                "path": str(src.fewshot), "sha256": file_sha256(src.fewshot),
                "items_in_file": len(load_rows(src.fewshot)), "seed": spec.seed},
            "note": "BUNDLED SAMPLE written for evalsuite, not the real benchmark" if bundled
            else "the hub's copy (datasets), cached" if src.source == "hub"
            else "user-supplied data in the hub schema"}


def assemble(spec: RunSpec, engines: dict[str, dict], context: dict, seconds: float) -> dict:
    """The comparison of two engines' per-item records (the reference's first): the paired verdict and the
    result file's content. One function for `run` and `merge`, so a merged run is the unsharded one."""
    (ka, a), (kb, b) = list(engines.items())
    ids = [r["doc_id"] for r in a["records"]]
    assert ids == [r["doc_id"] for r in b["records"]], "both engines must see the same items"
    v = stats.paired_verdict([r["correct"] for r in a["records"]], [r["correct"] for r in b["records"]],
                             margin=spec.margin)
    agree = float(np.mean([x["correct"] == y["correct"] for x, y in zip(a["records"], b["records"])]))
    # responses compared without special tokens: a text-only server strips them from its text (transformers serve)
    same_resp = float(np.mean([x["extracted"] == y["extracted"] and (
        x["generated_tokens"] is None or (x.get("response_plain") or x["response"]) == (
            y.get("response_plain") or y["response"])) for x, y in zip(a["records"], b["records"])]))
    verdict = v.verdict
    api_notes = context["api"]
    not_checked = list((api_notes or {}).get("not_checked", []))
    parity = parity_summary(b["records"], (api_notes or {}).get("parity") or {}, spec.dtype)
    failed_by = ["accuracy"] if verdict == "FAIL" else []
    if parity.get("judged"):
        not_checked += [f"parity: {n}" for n in parity["not_checked"]]
        if parity["items_failing"]:
            verdict = "FAIL"  # a bug is a bug: the engine claims the judge's model and numerics
            failed_by.append("parity")
    if verdict == "PASS" and not_checked:
        verdict = "INCONCLUSIVE"  # nothing unshown may contribute to a PASS
    result = {
        "verdict": verdict, "failed_by": failed_by, "not_checked": not_checked, "task": spec.task,
        "variant": spec.variant or DEFAULT_VARIANT[spec.task],
        "dataset": context["dataset"], "items": len(ids), "model": spec.model,
        "weights_sha256": context["weights_sha256"],
        "engine_under_test": api_notes, "api": api_notes,
        "engines": {k: {"accuracy": float(np.mean([r["correct"] for r in e["records"]])),
                        "accuracy_ci95": stats.wilson_ci(sum(r["correct"] for r in e["records"]), len(e["records"])),
                        "live_accuracy": e["live_accuracy"],
                        "primary_filter": e["primary_filter"], "lm_eval_results": e["lm_eval_results"],
                        "fingerprint": e["fingerprint"],
                        "failures": _failures(e["records"], spec.task)} for k, e in engines.items()},
        "paired": {"b": v.b, "c": v.c, "mcnemar_p": v.mcnemar_p, "loss_p": v.loss_p, "loss_upper": v.loss_upper,
                   "diff_ci": list(v.diff_ci), "item_agreement": agree, "identical_responses": same_resp,
                   "margin": v.margin, "alpha": v.alpha, "items_needed": v.items_needed,
                   "rule_of_three_upper": v.rule_of_three_upper, "explanation": v.explain(),
                   "meaning": f"b = {ka} right and {kb} wrong; c = {ka} wrong and {kb} right; diff = "
                              f"accuracy({kb}) - accuracy({ka})"},
        "parity": parity, "judge_work": judge_work(a["records"], b["records"]),
        "warnings": [f"not checked: {n}" for n in not_checked] + (
            [f"responses differ on {round((1 - same_resp) * len(ids))} of {len(ids)} items although greedy "
             "decoding of the same prompts should match: run `evalsuite diff` to localise it"]
            if same_resp < 1 else []),
        "verdict_rule": v.rule,
        "settle": _settle(spec, v, context["bundled"], context["n_items"]) if verdict == v.verdict else
        None if verdict == "FAIL" else
        ("remove what is listed as not checked: a server that takes token-id prompts or has a tokenize "
         "endpoint, and (for loglikelihood variants) states its echo logprobs come from its decode path "
         "(evalsuite serve does both), or a generative variant"),
        "spec": asdict(spec), "seed": spec.seed, "random_seed": LM_EVAL_RANDOM_SEED, "versions": versions(),
        "adapter_version": next(iter(engines.values())).get("adapter_version"),
        "seconds": round(seconds, 1),
    }
    if spec.shard is not None:
        result["shard_note"] = (f"shard {spec.shard}: a share of the items; its verdict is of this share only. "
                                "Combine all shards with `evalsuite merge RUN_DIR...` for the run's verdict")
    return result


def run_benchmark(spec: RunSpec, progress: Callable[[str], None] = lambda s: None) -> RunResult:
    from evalsuite.models import load_model

    t0 = time.time()
    out = Path(spec.output)
    out.mkdir(parents=True, exist_ok=True)
    src = resolve(spec.task, spec.data_dir)
    data, bundled = src.path, src.bundled
    rows = load_rows(data)
    check_rows(spec.task, data, rows)
    n_items = len(rows)
    tasks_dir = resolve_tasks(spec.task, src, out)
    model = load_model(spec.model)
    # the engine under test is built (a server probed) first: what it cannot do is refused before any work
    from evalsuite.plugins import make_engine

    variant = spec.variant or DEFAULT_VARIANT[spec.task]
    built = make_engine(spec.engine, model, spec.dtype, spec.fault, dict(spec.engine_options))
    caps = built.capabilities
    uses_forced = VARIANTS[spec.task][variant][3] == "acc"
    if uses_forced and not caps.forced:
        raise SpecError(f"{caps.forced_refusal}, so {spec.task}/{variant} (scored by loglikelihood) is impossible "
                        "over it" + (f"; {spec.variant_option} cot is generative" if spec.task == "gpqa" else ""))
    why_not = (f"the engine declares numerics of its own ({built.own_numerics})" if built.own_numerics else
               f"{spec.dtype}: judged against the reference's {spec.dtype} recipe by `evalsuite diff --dtype "
               f"{spec.dtype}`; here the float32 judge's tracks are compared and reported"
               if spec.dtype != "float32" else None)
    api_notes = {"engine_capabilities": caps.report(), "notes": list(caps.notes), "forced_path": caps.forced_path,
                 "not_checked": caps.not_checked(uses_forced),
                 "parity": {"judged": why_not is None, "why_not": why_not}}
    # the engine under test first: the judge then scores its answers (or, --judge-decodes, decodes its own)
    key = spec.engine if spec.engine != spec.against else spec.engine + "-under-test"  # its own folder, journal
    phases = {"setup_s": round(time.time() - t0, 1)}
    t = time.time()
    tested, eng_lm, requests = run_engine(spec, spec.engine, spec.dtype, spec.fault, tasks_dir, out, progress, built,
                                          key)
    # what blocks a PASS found while it ran (a served engine: prompts its tokenizer read otherwise)
    api_notes["not_checked"] = list(api_notes["not_checked"]) + list(built.run_notes())
    release_memory()  # the engine is done: its buffers go back before the judge runs
    phases["engine_s"], t = round(time.time() - t, 1), time.time()
    judged, judge_lm, _ = run_engine(spec, spec.against, "float32", None, tasks_dir, out, progress,
                                     answers=None if spec.judge_decodes else eng_lm.journal_record)
    engines = {spec.against: judged, key: tested}
    phases["judge_s"], t = round(time.time() - t, 1), time.time()
    if requests:
        parity_records(judge_lm, eng_lm, requests, tested["records"], spec.dtype, progress)
        eng_dir = out / key  # the records with their parity, as the folder's records.jsonl
        (eng_dir / "records.jsonl").write_text("".join(dumps(r, ensure_ascii=False) + "\n"
                                                       for r in tested["records"]))
    context = {"dataset": _dataset(src, data, bundled, n_items, spec), "weights_sha256": model.weights.sha256,
               "api": api_notes, "bundled": bundled, "n_items": n_items}
    phases["parity_s"] = round(time.time() - t, 1)
    result = assemble(spec, engines, context, time.time() - t0)
    result["phases"] = phases  # wall seconds of each phase of this process (a resumed run: of its own work)
    write_json(out / "comparison.json", result)
    typed = {k: result.pop(k) for k in ("verdict", "task", "variant", "items", "model", "settle")}
    return RunResult(**typed, not_checked=tuple(result.pop("not_checked")), warnings=tuple(result.pop("warnings")),
                     details=result)

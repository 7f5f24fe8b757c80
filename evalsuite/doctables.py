"""The docs' figure tables, each rendered from the committed JSON in benchmarks/results/ (evalsuite.docgen writes
them into docs/); a missing file, row or cell reads "not measured"."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

RESULTS = "benchmarks/results"
MISSING = "not measured"


# ---------------------------------------------------------------------------------------------- formatting


def _load(root: Path, rel: str) -> dict | None:
    path = root / rel
    return json.loads(path.read_text("utf-8")) if path.is_file() else None


def _get(d: dict | None, *keys, default=None):
    """d[k1][k2]... or default where any level is missing (rows added later may lack a field)."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _sci(x: float | None) -> str:
    """The docs' style: 2.6e-7, 0.749, 0 as 0."""
    if x is None:
        return MISSING
    if x == 0:
        return "0"
    if 0.01 <= abs(x) < 1000:
        return f"{x:.3g}"
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e+").replace("e+", "e")


def _num(x, fmt: str = "{}") -> str:
    return MISSING if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return MISSING if x is None else f"{100 * x:.2f}%"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _source(*rels: str, how: str = "") -> str:
    files = ", ".join(f"`{r}`" for r in rels)
    return f"From {files}{how}; `python -m evalsuite.docgen` writes this table.\n\n"


def _absent(rel: str) -> str:
    return f"{MISSING}: `{rel}` is not there.\n"


# ---------------------------------------------------------------------------------------------- detection


def _catch(v, fault: str | None) -> str:
    """A rule's first catch (prompts taken), or on the faithful engine (fault None) a false alarm."""
    if v is None:
        return "-"
    return f"FALSE ALARM at {v}" if fault is None else str(v)


def _rules(rows: list[dict]) -> list[str]:
    """Every rule any row measured, in the order they first appear (evalsuite first)."""
    seen: list[str] = []
    for r in rows:
        seen += [k for k in (r.get("first_caught") or {}) if k not in seen]
    return seen


def _detection_cells(r: dict, rules: list[str]) -> list[str]:
    caught, fault = r.get("first_caught") or {}, r.get("fault")
    cells = [_catch(caught[k], fault) if k in caught else MISSING for k in rules]
    before = _get(r, "evalsuite_recheck", "before", default=caught.get("evalsuite"))
    if "evalsuite" in caught and before != caught["evalsuite"]:  # re-checked under the current rule and moved
        cells[rules.index("evalsuite")] += f" (was {_catch(before, fault)})"
    return cells


def _build32(r: dict, f32: dict[tuple, dict] | None) -> str:
    """A bf16 `diff` also runs the engine's float32 build on the same prompts (evalsuite/compare/build.py),
    so it FAILs at the earlier of the bf16 catch and the float32 table's catch."""
    other = (f32 or {}).get((r.get("model"), r.get("fault")))
    if other is None or "evalsuite" not in (r.get("first_caught") or {}):
        return MISSING
    both = [v for v in (r["first_caught"]["evalsuite"], _get(other, "first_caught", "evalsuite")) if v]
    return _catch(min(both) if both else None, r.get("fault"))


def detection(dtype: str) -> Callable[[Path], str]:
    rel = f"{RESULTS}/detection-{dtype}.json"

    def render(root: Path) -> str:
        doc = _load(root, rel)
        if doc is None:
            return _absent(rel)
        rows, rels = doc.get("rows", []), [rel]
        rules = _rules(rows) or ["evalsuite"]
        f32 = None
        if dtype != "float32":
            rels.append(f"{RESULTS}/detection-float32.json")
            f32_doc = _load(root, rels[-1]) or {}
            f32 = {(x.get("model"), x.get("fault")): x for x in f32_doc.get("rows", [])}
        head = ["fault", "dtype", "model", *rules, *(["evalsuite + float32 build"] if f32 is not None else []),
                "prompts run"]
        body = []
        for r in rows:
            extra = [_build32(r, f32)] if f32 is not None else []
            body.append([r.get("fault") or "faithful (false alarms)", r.get("dtype", dtype), r.get("model", MISSING),
                         *_detection_cells(r, rules), *extra, _num(r.get("prompts_taken"))])
        return _source(*rels) + _table(head, body)

    return render


def detection_accuracy(task: str) -> Callable[[Path], str]:
    rel = f"{RESULTS}/detection-accuracy-{task}.json"

    def render(root: Path) -> str:
        doc = _load(root, rel)
        if doc is None:
            return _absent(rel)
        body = [[r.get("fault") or "faithful", r.get("model", MISSING),
                 _num(_get(r, "accuracy", "reference"), "{:.2f}"), _num(_get(r, "accuracy", "megakernel"), "{:.2f}"),
                 _num(_get(r, "paired", "b")), _num(_get(r, "paired", "c")), r.get("verdict", MISSING)]
                for r in doc.get("rows", [])]
        how = f" ({_num(doc.get('limit'))} items of {task})"
        return _source(rel, how=how) + _table(["fault", "model", "reference", "megakernel", "b", "c", "verdict"], body)

    return render


def detection_run(task: str) -> Callable[[Path], str]:
    """benchmarks/detection_accuracy.py's rows with the parity part: which part of `run` caught each fault."""
    rel = f"{RESULTS}/detection-run-{task}.json"

    def render(root: Path) -> str:
        doc = _load(root, rel)
        if doc is None:
            return _absent(rel)
        body = []
        for r in doc.get("rows", []):
            by = [k for k in ("accuracy", "parity") if r.get(f"caught_by_{k}")]
            ff = _get(r, "parity", "first_failure") or {}
            where = f"item {ff['doc_id']}, position {ff['position']} ({ff.get('kind', '?')})" if ff else "none"
            body.append([r.get("fault") or "faithful", r.get("model", MISSING), _num(r.get("items")),
                         _num(_get(r, "accuracy", "reference"), "{:.2f}"),
                         _num(_get(r, "accuracy", "megakernel"), "{:.2f}"),
                         f"{_num(_get(r, 'paired', 'b'))} / {_num(_get(r, 'paired', 'c'))}",
                         f"{_num(_get(r, 'parity', 'items_failing'))} of {_num(_get(r, 'parity', 'items'))}", where,
                         r.get("verdict", MISSING), " and ".join(by) or "not caught"])
        head = ["fault", "model", "items", "reference", "megakernel", "b / c", "parity: items failing",
                "first failure", "verdict", "caught by"]
        return _source(rel, how=f" ({_num(doc.get('limit'))} items of {task})") + _table(head, body)

    return render


def judge_scoring(root: Path) -> str:
    """benchmarks/judge_scoring.py: the judge scoring the engine's answers against decoding its own."""
    rows, rels = [], []
    for path in sorted((root / RESULTS).glob("judge-scoring-*.json")):
        doc = json.loads(path.read_text("utf-8"))
        rels.append(f"{RESULTS}/{path.name}")
        c, sc, de = doc.get("comparison") or {}, doc.get("scores") or {}, doc.get("decodes") or {}
        whole, judge = c.get("whole_run_s") or {}, c.get("judge_phase_s") or {}
        rows.append([f"{doc.get('task')}/{doc.get('variant') or 'default'}", doc.get("model", MISSING),
                     f"{_num(c.get('judge_answers_identical'))} of {_num(c.get('items'))}",
                     " / ".join(c.get("verdicts") or [MISSING]),
                     f"{_num(c.get('judge_decoded_tokens'))} of {_num(c.get('engine_generated_tokens'))} "
                     f"({_pct(c.get('decoded_share'))})",
                     f"{_num(judge.get('scores'), '{} s')} / {_num(judge.get('decodes'), '{} s')}",
                     f"{_num(whole.get('scores'), '{} s')} / {_num(whole.get('decodes'), '{} s')} "
                     f"({_num(c.get('whole_run_speedup'), '{}x')})",
                     f"{_num(sc.get('peak_rss_gb'), '{} GB')} / {_num(de.get('peak_rss_gb'), '{} GB')}",
                     f"{_num(_get(sc, 'parity', 'items_identical'))} of {_num(_get(sc, 'parity', 'items'))}, "
                     f"{_num(_get(sc, 'parity', 'items_failing'))} failing"])
    if not rows:
        return _absent(f"{RESULTS}/judge-scoring-*.json")
    head = ["task", "model", "judge's answers identical", "verdict (scores / decodes)",
            "judge decoded, of the engine's tokens", "judge phase (scores / decodes)",
            "whole run (scores / decodes)", "peak RSS (scores / decodes)", "parity: answers identical"]
    return _source(*rels) + _table(head, rows)


# ---------------------------------------------------------------------------------------------- false alarms


def _false_alarm_row(label: str, s: dict, chunks: list[dict]) -> list[str]:
    first = sum(len(c.get("flagged") or {}) for c in chunks)  # as first judged, before any re-judging
    walls = [c["wall_s"] for c in chunks if c.get("wall_s") is not None]
    spread = f"{min(walls):,.1f}-{max(walls):,.1f} s" if walls else MISSING
    three = s.get("rule_of_three_upper")  # bounds a rate only when nothing was flagged
    return [label, _num(s.get("prompts"), "{:,}"), f"**{s['flagged']}**" if "flagged" in s else MISSING,
            "(k > 0)" if s.get("flagged") and three is None else _pct(three),
            _pct(s.get("cp_upper_97_5")), str(first), _num(s.get("rejudged_chunks")),
            ", ".join(s.get("verdicts") or []) or MISSING, _num(s.get("wall_s"), "{:,.1f} s"), spread,
            _num(s.get("peak_rss_gb"), "{} GB")]


def false_alarms(root: Path, folder: str = RESULTS) -> str:
    """Every false-alarm run in the folder (benchmarks/results/, or its partial/ for runs still under way), one row
    per mode (in-process, served)."""
    paths = sorted((root / folder).glob("false-alarms-*.json"), key=lambda p: (len(p.stem), p.stem))  # plain first
    rows, rels = [], []
    for path in paths:
        doc = json.loads(path.read_text("utf-8"))
        dtype = _get(doc, "settings", "dtype", default=MISSING)
        tail = path.stem.removeprefix(f"false-alarms-{dtype}").strip("-").replace("-", " ")
        rels.append(f"{folder}/{path.name}")
        for mode, s in (doc.get("summary") or {}).items():
            chunks = [c for c in (doc.get("chunks") or {}).values() if c.get("mode") == mode]
            rows.append(_false_alarm_row(", ".join(x for x in (dtype, mode, tail) if x), s, chunks))
    if not rows:
        return _absent(f"{folder}/false-alarms-*.json")
    head = ["run", "prompts", "flagged", "95% upper, rule of three", "exact 97.5% (Clopper-Pearson)",
            "flagged when first judged", "chunks re-judged", "verdicts", "wall, summed", "wall per chunk",
            "peak RSS"]
    return _source(*rels) + _table(head, rows)


# ---------------------------------------------------------------------------------------------- calibration


def _first_run(runs: dict, label: str) -> dict:
    """The first timed run of the mode whose label starts with label ("with ...", "without ...")."""
    return next(((v or [{}])[0] for k, v in runs.items() if k.startswith(label)), {})


def diff_cost(root: Path) -> str:
    """benchmarks/diff_cost.py's runs: a diff with and without its batching part."""
    rows, rels = [], []
    for path in sorted((root / RESULTS).glob("diff-cost-*.json")):
        doc = json.loads(path.read_text("utf-8"))
        rels.append(f"{RESULTS}/{path.name}")
        s, runs = doc.get("settings") or {}, doc.get("runs") or {}
        with_, without = _first_run(runs, "with "), _first_run(runs, "without ")
        rows.append([s.get("model", MISSING), s.get("prompts", MISSING), _num(s.get("max_new_tokens")),
                     s.get("dtype", MISSING), f"{_num(with_.get('wall_s'), '{} s')} {with_.get('verdict', '')}",
                     _num(with_.get("batching_seconds"), "{} s"), _num(with_.get("batching_prompt_runs")),
                     f"{_num(without.get('wall_s'), '{} s')} {without.get('verdict', '')}",
                     ", ".join(without.get("paths_not_exercised") or []) or "none",
                     _num(doc.get("ratio"), "{:.2f}x")])
    if not rows:
        return _absent(f"{RESULTS}/diff-cost-*.json")
    head = ["model", "prompts", "new tokens", "dtype", "with the batching part", "of it, the part",
            "prompt runs in the part", "without (`--no-batching`)", "paths not exercised without", "ratio"]
    return _source(*rels) + _table(head, rows)


def _span(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return MISSING
    if max(xs) == 0:
        return f"0 on all {len(xs)} (bitwise the recipe)"
    return f"{_sci(min(xs))} to {_sci(max(xs))}"


def _recipe_row(name: str, r: dict) -> list[str]:
    n, over = len(r.get("prompts") or []), r.get("first_over")
    share0 = (r.get("share_over_per_layer") or [None])[0]
    past = MISSING if share0 is None else f"{round(share0 * n)} / {n}"
    if r.get("ok"):
        verdict = "ok" if name == "faithful" else "not caught"
    else:
        verdict = f"FAIL at layer {over['layer']}" if over else MISSING
    return [name if name == "faithful" else f"`{name}`", _span(r.get("engine_per_prompt_layer0") or []), past,
            verdict]


def recipe_check(stem: str) -> Callable[[Path], str]:
    rel = f"{RESULTS}/{stem}.json"

    def render(root: Path) -> str:
        doc = _load(root, rel)
        if doc is None:
            return _absent(rel)
        rows = doc.get("rows") or {}
        noise = _get(rows, "faithful", "orders_per_prompt_layer0", default=[])
        body = [["other reduction orders (the noise)", _span(noise), "", ""]]
        body += [_recipe_row(name, r) for name, r in rows.items()]
        prompts = ", ".join(f"`{p}`" for p in _get(rows, "faithful", "prompts", default=[]))
        how = f" ({doc.get('model', MISSING)}, taps after {_num(doc.get('decoded_steps'))} decode steps; {prompts})"
        head = ["engine", "layer 0, per prompt", "prompts past the bound at layer 0", "recipe check"]
        return _source(rel, how=how) + _table(head, body)

    return render


def noise_floor(root: Path) -> str:
    rel = f"{RESULTS}/calibrate-varied.json"
    doc = _load(root, rel)
    if doc is None:
        return _absent(rel)
    keys = ["max_dlogit", "p99_dlogit", "mean_dlogit", "max_kl", "p99_kl", "mean_kl"]
    body = [[f"`{name}`", _num(f.get("positions"), "{:,}"), *(_sci(f.get(k)) for k in keys)]
            for name, f in (doc.get("figures") or {}).items()]
    how = f" ({doc.get('model', MISSING)}, {_num(doc.get('prompts'))} prompts of the varied set)"
    head = ["comparison (on the reference alone)", "positions", "max \\|Δlogit\\|", "p99", "mean", "max KL", "p99 KL",
            "mean KL"]
    return _source(rel, how=how) + _table(head, body)


# ---------------------------------------------------------------------------------------------- accuracy runs


def reference_accuracy(root: Path) -> str:
    rows, rels = [], []
    for path in sorted((root / RESULTS).glob("accuracy-*.json")):
        d = json.loads(path.read_text("utf-8"))
        rels.append(f"{RESULTS}/{path.name}")
        for name, f in (d.get("by_filter") or {}).items():
            lo, hi = (f.get("wilson95") or [None, None])[:2]
            rows.append([d.get("model", MISSING), d.get("engine", MISSING), f"{d.get('task')} {d.get('variant')}",
                         _num(d.get("items")), name, _num(f.get("correct")), _num(f.get("accuracy"), "{:.3f}"),
                         f"{_num(lo, '{:.3f}')}-{_num(hi, '{:.3f}')}", _num(d.get("seconds"), "{:,.1f} s"),
                         _num(d.get("peak_rss_gb"), "{} GB")])
    if not rows:
        return _absent(f"{RESULTS}/accuracy-*.json")
    head = ["model", "engine", "task", "items", "filter", "correct", "accuracy", "Wilson 95%", "wall", "peak RSS"]
    return _source(*rels) + _table(head, rows)


def _acc(e: dict) -> str:
    lo, hi = (e.get("accuracy_ci95") or [None, None])[:2]
    return f"{_num(e.get('accuracy'), '{:.4f}')} [{_num(lo, '{:.4f}')}, {_num(hi, '{:.4f}')}]"


def gsm8k_full(root: Path) -> str:
    """The full GSM8K run: its merged verdict, then each exported shard's run.json."""
    base = f"{RESULTS}/gsm8k-full"
    merged = _load(root, f"{base}/merged/comparison.json")
    if merged is None:
        return _absent(f"{base}/merged/comparison.json")
    eng, p = merged.get("engines") or {}, merged.get("paired") or {}
    top = _table(["items", "reference [95% Wilson]", "megakernel [95% Wilson]", "b", "c", "loss at 97.5% at most",
                  "identical responses", "verdict"],
                 [[_num(merged.get("items"), "{:,}"), _acc(eng.get("reference") or {}),
                   _acc(eng.get("megakernel") or {}), _num(p.get("b")), _num(p.get("c")),
                   _num(p.get("loss_upper"), "{:.4f}"), _num(p.get("identical_responses"), "{:.3f}"),
                   merged.get("verdict", MISSING)]])
    shards = []
    for path in sorted((root / base).glob("s*/run.json")):
        r = json.loads(path.read_text("utf-8"))
        shards.append([r.get("shard", MISSING), _num(r.get("items")),
                       _num(_get(r, "accuracy", "reference"), "{:.4f}"),
                       _num(_get(r, "accuracy", "megakernel"), "{:.4f}"), r.get("verdict_of_this_share", MISSING),
                       _num(r.get("wall_s"), "{:,.1f} s"), _num(r.get("peak_rss_gb"), "{} GB")])
    low = _table(["shard", "items", "reference", "megakernel", "verdict of its share", "wall", "peak RSS"], shards)
    return _source(f"{base}/merged/comparison.json", f"{base}/s*/run.json") + top + "\n" + low


# ---------------------------------------------------------------------------------------------- the pages


CATALOGUE_ENGINE = "megakernel"  # the engine whose faults docs/faults.md catalogues: evalsuite's own fused engine


def fault_catalogue(root: Path, engine: str = CATALOGUE_ENGINE) -> str:
    from evalsuite.plugins import fault_catalogue as rows  # loads the engine (and jax): only when asked

    return _table(["fault", "what the engine does", "the real bug it stands for", "shows with"],
                  [[f"`{r['name']}`", r["what"], r["stands_for"], r["shows_with"]] for r in rows(engine)])

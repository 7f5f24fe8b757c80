"""`evalsuite merge RUN_DIR...`: combine the N shards of one `evalsuite run --shard i/N` into the run's result.

Each shard ran a deterministic share of the items (doc_id % N == i) with its own journal; lm-eval built every
item's prompt in every shard, so each item's few-shot exemplars are those of an unsharded run. Merging
concatenates the shards' per-item records in doc_id order and computes the comparison with the same function
as `run` (evalsuite.bench.run.assemble): the same records and the same verdict as one unsharded run. A missing
or repeated shard, shards of different runs (task, data, model, weights, engines, settings) or an item in two
shards is a one-line error.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

from evalsuite.bench.run import RunSpec, assemble
from evalsuite.errors import SpecError
from evalsuite.report import dumps, write_json
from evalsuite.results import RunResult

# What must be equal in every shard (spec fields besides shard and output, and the result's identity)
SAME = ("task", "variant", "engine", "against", "model", "limit", "dtype", "fault", "margin", "seed",
        "engine_options")


def load_result(d: Path) -> dict:
    """A finished run folder's (or export's) comparison.json."""
    f = d / "comparison.json"
    if not f.is_file():
        raise SpecError(f"{d} is not a finished run folder (no comparison.json)")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"{f} is not valid JSON: {e}") from None


def _load(d: Path) -> dict:
    doc = load_result(d)
    if not (doc.get("spec") or {}).get("shard"):
        raise SpecError(f"{d} is not a shard (it was run without --shard)")
    return doc


def records_path(d: Path, doc: dict, engine: str) -> Path:
    """Where a run's per-item records of one engine are (beside its lm-eval results; an export's are relative)."""
    path = Path(doc["engines"][engine]["lm_eval_results"]).parent / "records.jsonl"
    path = path if path.is_absolute() else d / path
    if not path.is_file():
        raise SpecError(f"missing {path}")
    return path


def read_records(d: Path, doc: dict, engine: str) -> list[dict]:
    """One engine's per-item records; a line that is not JSON is a one-line error naming file and line."""
    path, out = records_path(d, doc, engine), []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out += [json.loads(line)] if line.strip() else []
        except json.JSONDecodeError as e:
            raise SpecError(f"{path}:{n} is not a record of `evalsuite run` ({e})") from None
    return out


def merge_runs(dirs: list[str], output: str) -> RunResult:
    pairs = [(d, _load(Path(d))) for d in dirs]
    docs = dict(pairs)
    shards: dict[int, str] = {}
    n_of = {doc["spec"]["shard"].split("/")[1] for _, doc in pairs}
    if len(n_of) != 1:
        raise SpecError(f"shards of different splits: N = {', '.join(sorted(n_of))}")
    n = int(n_of.pop())
    for d, doc in pairs:
        i = int(doc["spec"]["shard"].split("/")[0])
        if i in shards:
            raise SpecError(f"shard {i}/{n} given twice: {shards[i]} and {d}")
        shards[i] = d
    missing = sorted(set(range(n)) - set(shards))
    if missing:
        raise SpecError(f"missing shard(s) {', '.join(f'{i}/{n}' for i in missing)}")
    first = docs[shards[0]]
    for d, doc in docs.items():
        for key in SAME:
            if doc["spec"].get(key) != first["spec"].get(key):
                raise SpecError(f"{d} is a shard of another run: {key} {doc['spec'].get(key)!r} "
                                f"!= {first['spec'].get(key)!r} in {shards[0]}")
        for key, get in (("weights_sha256", lambda x: x["weights_sha256"]),
                         ("data sha256", lambda x: x["dataset"]["sha256"]),
                         ("library versions (lm-eval builds the prompts)", lambda x: x["versions"]),
                         # an adapter change (how requests are built or scored) must not mix into one run; shards
                         # from before the field was recorded have None, which matches only each other
                         ("adapter version", lambda x: x.get("adapter_version"))):
            if get(doc) != get(first):
                raise SpecError(f"{d} is a shard of another run: its {key} differs from {shards[0]}'s")
    engines = {}
    for name, summary in first["engines"].items():
        by_shard = {shards[i]: docs[shards[i]]["engines"][name].get("fingerprint") for i in range(n)}
        prints = set(by_shard.values())
        if None in prints:
            old = next(d for d, fp in by_shard.items() if fp is None)
            raise SpecError(f"{old} does not record its {name} engine's fingerprint (it predates them): "
                            "shards cannot be shown to come from one engine build; rerun that shard")
        if len(prints) > 1:
            raise SpecError(f"the shards ran different builds of the {name} engine (fingerprints differ): "
                            "rerun them from one checkout")
        recs = [r for i in range(n) for r in read_records(Path(shards[i]), docs[shards[i]], name)]
        ids = [r["doc_id"] for r in recs]
        if len(set(ids)) != len(ids):
            dup = sorted({x for x in ids if ids.count(x) > 1})[:3]
            raise SpecError(f"item(s) {dup} appear in more than one shard")
        engines[name] = {"records": sorted(recs, key=lambda r: r["doc_id"]), "live_accuracy": None,
                         "primary_filter": summary["primary_filter"], "fingerprint": prints.pop(),
                         "lm_eval_results": [docs[shards[i]]["engines"][name]["lm_eval_results"] for i in range(n)]}
    known = {f.name for f in fields(RunSpec)}
    spec = replace(RunSpec(**{k: v for k, v in first["spec"].items() if k in known and k != "remote"}
                           | {"engine_options": tuple(tuple(x) for x in first["spec"].get("engine_options") or ())}),
                   shard=None, output=output)
    context = {"dataset": first["dataset"], "weights_sha256": first["weights_sha256"], "api": first["api"],
               "bundled": first["dataset"]["bundled_sample"], "n_items": first["dataset"]["items_in_file"]}
    result = assemble(spec, engines, context, sum(doc["seconds"] for doc in docs.values()))
    result["merged_from"] = [shards[i] for i in range(n)]
    # what produced the records is the shards' software (checked equal above), not the merging process's
    result["versions"], result["adapter_version"] = first["versions"], first.get("adapter_version")
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for name, e in engines.items():
        (out / name).mkdir(exist_ok=True)
        (out / name / "records.jsonl").write_text("".join(dumps(r, ensure_ascii=False) + "\n"
                                                          for r in e["records"]))
    write_json(out / "comparison.json", result)
    typed = {k: result.pop(k) for k in ("verdict", "task", "variant", "items", "model", "settle")}
    return RunResult(**typed, not_checked=tuple(result.pop("not_checked")), warnings=tuple(result.pop("warnings")),
                     details=result)

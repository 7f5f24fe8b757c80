"""`evalsuite export RUN_DIR --output DIR`: a run's per-item evidence without the benchmark's text, to publish.

A run folder holds the data's text: lm-eval's prompts in the journals, the gold answers in each record's
`target`, and for GPQA the model's answers may quote a question (GPQA's authors ask that its questions never
appear on the web). The export keeps what the verdict rests on and nothing of the data: `comparison.json`
(spec, dataset sha256, weights sha256, engine fingerprints, the verdict) and, per engine, the records without
`target`; what the failure analysis read from the text is computed here and kept as numbers
(`gold_in_response` for GSM8K, `repetition`); GPQA responses become their sha256 (equal responses stay
equal, so the paired comparison is unchanged). `evalsuite merge` takes exported shards like run folders, so
the shards of a long run can be computed on different hosts or days and kept, e.g. committed, as they finish.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from evalsuite.bench.merge import load_result, read_records, records_path
from evalsuite.bench.run import gold_in_response, repetition
from evalsuite.errors import SpecError
from evalsuite.report import dumps, write_json

HASHED_RESPONSES = ("gpqa",)  # tasks whose model answers may quote the data: responses kept as sha256 only


def _record(r: dict, task: str) -> dict:
    out = {k: v for k, v in r.items() if k != "target"}
    if r["generated_tokens"] is not None:  # an export of an export keeps the figures it has
        out["repetition"] = r["repetition"] if "repetition" in r else repetition(r["response"] or "")
        if task == "gsm8k":
            out["gold_in_response"] = r["gold_in_response"] if "gold_in_response" in r else gold_in_response(r)
    for key in ("response", "response_plain"):
        if task in HASHED_RESPONSES and out.get(key) is not None and not str(out[key]).startswith("sha256:"):
            out[key] = "sha256:" + hashlib.sha256(str(out[key]).encode()).hexdigest()
    return out


def export_run(run_dir: str, output: str) -> dict:
    src, out = Path(run_dir), Path(output)
    doc = load_result(src)
    if out.resolve() == src.resolve():
        raise SpecError("--output must be another folder than the run's")
    task, kept = doc["task"], {}
    for name, summary in doc["engines"].items():
        records = []
        for n, r in enumerate(read_records(src, doc, name), 1):
            try:
                records.append(_record(r, task))
            except (KeyError, TypeError) as e:
                raise SpecError(f"{records_path(src, doc, name)}:{n} is not a record of `evalsuite run` "
                                f"({type(e).__name__}: {e})") from None
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "records.jsonl").write_text("".join(dumps(r, ensure_ascii=False) + "\n" for r in records))
        summary["lm_eval_results"] = f"{name}/lm_eval_results.json"  # relative: the export can move
        kept[name] = len(records)
    doc["exported"] = {"from": str(src), "records": kept,
                       "removed": "the data's text: prompts (journals), gold answers (target)" +
                                  (", responses (sha256 kept)" if task in HASHED_RESPONSES else "")}
    write_json(out / "comparison.json", doc)
    return {"output": str(out), "task": task, "shard": doc["spec"].get("shard"), "records": kept}

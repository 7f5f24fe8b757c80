"""`run --shard i/N` + `merge`: the merged result is the unsharded run's (same records, prompts included, so the
same few-shot exemplars per item; same verdict), and a missing, repeated or foreign shard is a one-line error.
In-process (one process compiles the mini model once); one CLI call checks the error's one-line form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalsuite.bench.export import export_run
from evalsuite.bench.merge import merge_runs
from evalsuite.bench.run import RunSpec, run_benchmark
from evalsuite.compare import rule
from evalsuite.errors import SpecError


def records(d: Path, engine: str) -> list[dict]:
    return [json.loads(x) for x in (d / engine / "records.jsonl").read_text().splitlines()]


def same_records(merged: list[dict], full: list[dict]) -> None:
    """Equal, except each parity part's largest logprob distance, which may move within the float32 noise floor:
    the judge scores a shard's answers in other batches than the full run's (batch composition changes the
    reduction order), and only that float, never a position's verdict, may differ."""
    assert len(merged) == len(full)
    for m, f in zip(merged, full):
        mp, fp = dict(m.get("parity") or {}), dict(f.get("parity") or {})
        a, b = mp.pop("max_dlogprob", None), fp.pop("max_dlogprob", None)
        assert (a is None) == (b is None) and abs((a or 0.0) - (b or 0.0)) <= rule.NOISE_TOL["float32"]
        assert {**m, "parity": mp} == {**f, "parity": fp}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for name, shard in (("full", None), ("s0", "0/2"), ("s1", "1/2")):
        run_benchmark(RunSpec(task="gsm8k", model="mini-llama", limit=2, output=str(root / name), shard=shard))
    return root


def test_merge_equals_the_unsharded_run(runs):
    merge_runs([str(runs / "s0"), str(runs / "s1")], str(runs / "merged"))
    full = json.loads((runs / "full" / "comparison.json").read_text())
    merged = json.loads((runs / "merged" / "comparison.json").read_text())
    for engine in ("reference", "megakernel"):
        same_records(records(runs / "merged", engine), records(runs / "full", engine))  # prompt_sha256: same exemplars
        # each shard computed (and journaled) only its own items: one generation request per gsm8k item
        assert {r["doc_id"] % 2 for r in records(runs / "s1", engine)} == {1}
        journal = (runs / "s1" / engine / "journal.jsonl").read_text().splitlines()
        assert len([x for x in journal if '"kind": "gen"' in x]) == len(records(runs / "s1", engine)) == 1
        assert merged["engines"][engine]["accuracy"] == full["engines"][engine]["accuracy"]
    assert (merged["verdict"], merged["items"], merged["paired"]) == (full["verdict"], full["items"], full["paired"])
    assert merged["spec"]["shard"] is None and len(merged["merged_from"]) == 2
    assert merged["engines"]["megakernel"]["fingerprint"] == full["engines"]["megakernel"]["fingerprint"]
    from evalsuite.bench.adapter import ADAPTER_VERSION
    assert merged["adapter_version"] == full["adapter_version"] == ADAPTER_VERSION


def test_missing_repeated_and_foreign_shards_are_errors(runs, tmp_path):
    out = str(tmp_path / "m")
    for dirs, message in (([runs / "s0"], "missing shard(s) 1/2"), ([runs / "s0", runs / "s0"], "given twice"),
                          ([runs / "s0", runs / "full"], "is not a shard")):
        with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
            merge_runs([str(d) for d in dirs], out)
    doc = json.loads((runs / "s1" / "comparison.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    doc["spec"]["limit"] = 7
    (other / "comparison.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="is a shard of another run: limit"):
        merge_runs([str(runs / "s0"), str(other)], out)
    doc["spec"]["limit"] = 2
    doc["versions"] = {**doc["versions"], "lm_eval": "0.0.0"}
    (other / "comparison.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="its library versions"):
        merge_runs([str(runs / "s0"), str(other)], out)
    doc["versions"] = json.loads((runs / "s1" / "comparison.json").read_text())["versions"]
    # another adapter (requests built or scored otherwise), or one shard from before the field was recorded
    for version in (doc["adapter_version"] + 1, None):
        doc["adapter_version"] = version
        (other / "comparison.json").write_text(json.dumps(doc))
        with pytest.raises(SpecError, match="its adapter version differs"):
            merge_runs([str(runs / "s0"), str(other)], out)
    doc["adapter_version"] = json.loads((runs / "s1" / "comparison.json").read_text())["adapter_version"]
    # a shard from another build of an engine (another checkout, another session) is refused, and so is one that
    # cannot show which build it ran
    for fp, message in (("another-build", "different builds of the megakernel engine"),
                        (None, "does not record its megakernel engine's fingerprint")):
        doc["engines"]["megakernel"]["fingerprint"] = fp
        (other / "comparison.json").write_text(json.dumps(doc))
        with pytest.raises(SpecError, match=message):
            merge_runs([str(runs / "s0"), str(other)], out)
    with pytest.raises(SpecError, match="--shard must be i/N"):
        RunSpec(task="gsm8k", shard="2/2")
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "merge", str(runs / "s0"), "--output", out],
                       capture_output=True, text=True, timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "missing shard(s) 1/2" in lines[0], p.stderr
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "export", str(tmp_path), "--output", out],
                       capture_output=True, text=True, timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "is not a finished run folder" in lines[0], p.stderr


def test_exported_shards_hold_no_data_text_and_merge_to_the_unsharded_run(runs, tmp_path):
    for s in ("s0", "s1"):
        export_run(str(runs / s), str(tmp_path / s))
    # the export moves: merge finds its records relative to it, not where the run was
    (tmp_path / "s1").rename(tmp_path / "moved")
    merge_runs([str(tmp_path / "s0"), str(tmp_path / "moved")], str(tmp_path / "merged"))
    full = json.loads((runs / "full" / "comparison.json").read_text())
    merged = json.loads((tmp_path / "merged" / "comparison.json").read_text())
    assert (merged["verdict"], merged["items"], merged["paired"]) == (full["verdict"], full["items"], full["paired"])
    for engine in ("reference", "megakernel"):
        assert merged["engines"][engine]["failures"] == full["engines"][engine]["failures"]
        assert merged["engines"][engine]["accuracy"] == full["engines"][engine]["accuracy"]
        text = (tmp_path / "s0" / engine / "records.jsonl").read_text()
        assert '"target"' not in text and all(r["target"] not in text for r in records(runs / "s0", engine))
        assert [r["response"] for r in records(tmp_path / "s0", engine)] == \
            [r["response"] for r in records(runs / "s0", engine)]
    assert not list((tmp_path / "s0").rglob("journal.jsonl")) and not list((tmp_path / "s0").rglob("*.yaml"))
    export_run(str(tmp_path / "s0"), str(tmp_path / "again"))  # an export of an export (it tracebacked) is itself
    for engine in ("reference", "megakernel"):
        assert records(tmp_path / "again", engine) == records(tmp_path / "s0", engine)
    with open(tmp_path / "again" / "reference" / "records.jsonl", "a") as f:
        f.write('{"doc_id": 9}\n')
    with pytest.raises(SpecError, match="records.jsonl:2 is not a record"):
        export_run(str(tmp_path / "again"), str(tmp_path / "third"))


def test_gpqa_exports_keep_responses_as_sha256_only(tmp_path):
    run = tmp_path / "run"
    (run / "reference").mkdir(parents=True)
    rec = {"doc_id": 0, "prompt_sha256": "ab", "response": "a quoted question", "extracted": "(A)", "target": "(B)",
           "correct": False, "finish_reason": "length", "generated_tokens": 256}
    (run / "reference" / "records.jsonl").write_text(json.dumps(rec) + "\n")
    doc = {"task": "gpqa", "spec": {"shard": "0/2"},
           "engines": {"reference": {"lm_eval_results": str(run / "reference" / "lm_eval_results.json")}}}
    (run / "comparison.json").write_text(json.dumps(doc))
    export_run(str(run), str(tmp_path / "out"))
    text = (tmp_path / "out" / "reference" / "records.jsonl").read_text()
    assert "quoted" not in text and "(B)" not in text and '"response": "sha256:' in text
    assert json.loads(text)["repetition"] == 0.0

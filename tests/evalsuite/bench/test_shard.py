"""`run --shard i/N` + `merge`: the merged result is the unsharded run's (same records, prompts included, so the
same few-shot exemplars per item; same verdict), and a missing, repeated or foreign shard is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = ["run", "gsm8k", "--model", "mini-llama", "--limit", "6", "--json"]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True, timeout=900)


def records(d: Path, engine: str) -> list[dict]:
    return [json.loads(x) for x in (d / engine / "records.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for name, extra in (("full", []), ("s0", ["--shard", "0/2"]), ("s1", ["--shard", "1/2"])):
        p = cli(*RUN, "--output", str(root / name), *extra)
        assert p.returncode in (0, 3), p.stderr
    return root


def test_merge_equals_the_unsharded_run(runs):
    p = cli("merge", str(runs / "s0"), str(runs / "s1"), "--output", str(runs / "merged"), "--json")
    assert p.returncode in (0, 3), p.stderr
    full = json.loads((runs / "full" / "comparison.json").read_text())
    merged = json.loads((runs / "merged" / "comparison.json").read_text())
    for engine in ("reference", "megakernel"):
        assert records(runs / "merged", engine) == records(runs / "full", engine)  # prompt_sha256: same exemplars
        # each shard computed (and journaled) only its own items: one generation request per gsm8k item
        assert {r["doc_id"] % 2 for r in records(runs / "s1", engine)} == {1}
        journal = (runs / "s1" / engine / "journal.jsonl").read_text().splitlines()
        assert len([x for x in journal if '"kind": "gen"' in x]) == len(records(runs / "s1", engine)) == 3
        assert merged["engines"][engine]["accuracy"] == full["engines"][engine]["accuracy"]
    assert (merged["verdict"], merged["items"], merged["paired"]) == (full["verdict"], full["items"], full["paired"])
    assert merged["spec"]["shard"] is None and len(merged["merged_from"]) == 2


def _one_line(p, needle):
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_missing_repeated_and_foreign_shards_are_errors(runs, tmp_path):
    _one_line(cli("merge", str(runs / "s0"), "--output", str(tmp_path / "m")), "missing shard(s) 1/2")
    _one_line(cli("merge", str(runs / "s0"), str(runs / "s0"), "--output", str(tmp_path / "m")),
              "shard 0/2 given twice")
    _one_line(cli("merge", str(runs / "s0"), str(runs / "full"), "--output", str(tmp_path / "m")),
              "is not a shard")
    doc = json.loads((runs / "s1" / "comparison.json").read_text())
    other = tmp_path / "other"
    (other / "reference").mkdir(parents=True)
    doc["spec"]["limit"] = 7
    (other / "comparison.json").write_text(json.dumps(doc))
    _one_line(cli("merge", str(runs / "s0"), str(other), "--output", str(tmp_path / "m")),
              "is a shard of another run: limit")
    _one_line(cli(*RUN, "--shard", "2/2", "--output", str(tmp_path / "x")), "--shard must be i/N")

"""`evalsuite run`: offline runs, real-data path, bad input, and kill-and-resume with a real signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **OFFLINE})


@pytest.mark.parametrize("task", ["gpqa", pytest.param("gsm8k", marks=pytest.mark.heavy)])
def test_gsm8k_and_gpqa_on_bundled_data(tmp_path, task):
    # CI: gpqa (loglikelihood); the generative gsm8k path runs in CI through the --data DIR and --data hub test
    p = cli("run", task, "--model", "mini-llama", "--limit", "2", "--output", str(tmp_path / task), "--json")
    # faithful engines, 2 items: nothing discordant, far too few items for a PASS
    assert p.returncode == 3, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["dataset"]["bundled_sample"] and "BUNDLED SAMPLE" in r["dataset"]["note"]
    assert r["items"] == 2 and set(r["engines"]) == {"reference", "megakernel"}
    for k in ("b", "c", "mcnemar_p", "diff_ci"):
        assert k in r["paired"]
    assert r["verdict"] == "INCONCLUSIVE" and r["paired"]["items_needed"] == 183
    for e in r["engines"].values():  # the progress bar's running accuracy ends at lm-eval's score
        assert e["live_accuracy"] == pytest.approx(e["accuracy"])
    assert (tmp_path / task / "megakernel" / "records.jsonl").read_text().count("\n") == 2
    assert (tmp_path / task / "reference" / "lm_eval_results.json").is_file()


@pytest.mark.heavy  # 40 s in CI's run; the real sets' folder (../shared/data) is read in CI by test_real_data
def test_data_dir_in_hub_schema_is_used_and_named(tmp_path):
    import datasets

    d = tmp_path / "hub" / "gsm8k" / "main"
    d.mkdir(parents=True)
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(4)]
    datasets.Dataset.from_list(rows).to_parquet(str(d / "test-00000-of-00001.parquet"))
    train = [{"question": f"What is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(6)]
    datasets.Dataset.from_list(train[:4]).to_parquet(str(d / "train-00000-of-00001.parquet"))
    p = cli("run", "gsm8k", "--model", "mini-llama", "--data-dir", str(tmp_path / "hub"),
            "--output", str(tmp_path / "o"))
    assert p.returncode == 2 and "4 rows, fewer than the 5 exemplars" in p.stderr and "Traceback" not in p.stderr
    datasets.Dataset.from_list(train).to_parquet(str(d / "train-00000-of-00001.parquet"))
    p = cli("run", "gsm8k", "--model", "mini-llama", "--data-dir", str(tmp_path / "hub"), "--limit", "2",
            "--output", str(tmp_path / "out"), "--json")
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert not r["dataset"]["bundled_sample"] and r["dataset"]["path"].endswith(".parquet")
    assert r["items"] == 2 and r["dataset"]["items_in_file"] == 4 and r["dataset"]["source"] == "dir"
    assert r["dataset"]["fewshot"]["path"].endswith("train-00000-of-00001.parquet")  # lm-eval's exemplar split
    assert r["dataset"]["fewshot"]["seed"] == 1234 and r["dataset"]["fewshot"]["items_in_file"] == 6
    # --data hub reads the hub's copy from its cache (filled here by hand: no network on this machine)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "gsm8k-main-test.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows[:2]))
    (cache / "gsm8k-main-train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in train))
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", "gsm8k", "--model", "mini-llama", "--data", "hub",
                        "--output", str(tmp_path / "hub"), "--json"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **OFFLINE, "EVALSUITE_DATA_CACHE": str(cache)})
    r = json.loads(p.stdout)
    assert (r["dataset"]["source"], r["dataset"]["origin"], r["items"]) == ("hub", "openai/gsm8k/main/test", 2)


@pytest.mark.parametrize("args,needle", [
    (["run", "mmlu"], "unknown task 'mmlu'"),
    (["run", "gsm8k", "--variant", "10shot"], "unknown variant '10shot'"),
    (["run", "gsm8k", "--margin", "5"], "--margin must be in (0, 1)"),
])
def test_bad_input_one_line(args, needle):
    p = cli(*args, "--model", "mini-llama")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0]


GPQA_COLUMNS = ("Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                "Incorrect Answer 3")


def _gpqa_csv(rows, encoding="utf-8") -> bytes:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(GPQA_COLUMNS)
    w.writerows(rows)
    return buf.getvalue().encode(encoding)


@pytest.mark.parametrize("case,needle", [
    ("empty", "no rows"),
    ("duplicate", "duplicate item: rows 0 and 2 have the same Record ID 'rec1'"),
    ("encoding", "cannot read as csv (UnicodeDecodeError"),
    ("no-train", "no gsm8k train split"),
])
def test_bad_data_is_one_line(tmp_path, case, needle):
    """Bad data files: exit 2 and one line naming the file and the problem, before any engine runs."""
    d = tmp_path / "data"
    d.mkdir()
    row = ["rec1", "Which is heavier, 1 kg of lead or 2 kg of feathers?", "feathers", "lead", "same", "neither"]
    task = "gsm8k" if case == "no-train" else "gpqa"
    if case == "empty":
        (d / "gpqa_diamond.csv").write_bytes(_gpqa_csv([]))
    elif case == "duplicate":
        (d / "gpqa_diamond.csv").write_bytes(_gpqa_csv([row, ["rec2", *row[1:]], row]))
    elif case == "encoding":  # UTF-16 is not what the hub's CSV is (UTF-8)
        (d / "gpqa_diamond.csv").write_bytes(_gpqa_csv([row, ["rec2", "Ångström?", *row[2:]]], "utf-16"))
    else:
        (d / "test.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    p = cli("run", task, "--model", "mini-llama", "--data", str(d), "--output", str(tmp_path / "o"))
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(lines) == 1, p.stderr[-1500:]
    assert needle in lines[0]


def test_missing_columns_and_corrupt_journal(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "test.jsonl").write_text(json.dumps({"q": "x"}) + "\n")
    p = cli("run", "gsm8k", "--model", "mini-llama", "--data-dir", str(d), "--output", str(tmp_path / "o"))
    assert p.returncode == 2 and "missing columns ['question', 'answer']" in p.stderr
    out = tmp_path / "o2"
    (out / "megakernel").mkdir(parents=True)  # the engine under test runs first: its journal is read at once
    (out / "megakernel" / "journal.jsonl").write_text('{"key": "a", "kind": "gen", "result": "x"}\n{broken\n')
    p = cli("run", "gsm8k", "--model", "mini-llama", "--limit", "2", "--output", str(out))
    assert p.returncode == 2 and "corrupt journal line 2" in p.stderr and "Traceback" not in p.stderr


def test_kill_and_resume_loses_and_redoes_nothing(tmp_path):
    out = tmp_path / "run"
    # the sanity task: short generations, so the kill (after the first journaled batch) is all the test waits for
    args = [sys.executable, "-m", "evalsuite.cli", "run", "sanity", "--model", "mini-llama", "--limit", "100",
            "--output", str(out), "--json"]
    journal = out / "megakernel" / "journal.jsonl"  # the engine under test runs first, 8 answers a call
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **OFFLINE})
    deadline = time.time() + 600
    while time.time() < deadline:  # wait until at least one batch is journaled, then kill mid-run
        if journal.exists() and journal.read_text().count("\n") >= 8:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = journal.read_text().splitlines()
    assert len(before) >= 8
    p = cli("run", "sanity", "--model", "mini-llama", "--limit", "100", "--output", str(out), "--json")
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    after = journal.read_text().splitlines()
    assert after[:len(before)] == before  # nothing lost or rewritten
    keys = [json.loads(x)["key"] for x in after]
    assert len(keys) == len(set(keys))  # nothing redone (a prompt the task repeats is computed once)
    assert json.loads(p.stdout)["items"] == 100
    whole = tmp_path / "whole"  # the same run, never interrupted: the same requests, nothing missing
    p = cli("run", "sanity", "--model", "mini-llama", "--limit", "100", "--output", str(whole), "--json")
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    want = {json.loads(x)["key"] for x in (whole / "megakernel" / "journal.jsonl").read_text().splitlines()}
    assert set(keys) == want and len(before) < len(want), "nothing missing; the kill landed mid-run"


@pytest.mark.heavy  # 73 s in CI; CI FAILs stale_feedback through verify on mini-llama (test_evidence.py)
def test_reference_against_itself_in_bf16_keeps_two_folders(tmp_path):
    """--engine reference (its bf16 recipe) against the float32 reference: each run has its own records and
    journal (they once shared one folder, and the second run's records replaced the first's)."""
    p = cli("run", "gpqa", "--model", "mini-llama", "--engine", "reference", "--dtype", "bfloat16", "--limit", "3",
            "--output", str(tmp_path / "r"), "--json")
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    r = json.loads(p.stdout)
    folders = {k: Path(e["lm_eval_results"]).parent for k, e in r["engines"].items()}
    assert set(folders) == {"reference", "reference-under-test"} and len(set(folders.values())) == 2
    for f in folders.values():
        assert (f / "records.jsonl").read_text().count("\n") == 3 and (f / "journal.jsonl").is_file()


@pytest.mark.heavy  # 71 s; CI: the exact test's FAIL (tests/evalsuite/bench/test_stats.py) and a run FAILed
# end to end through verify (tests/evalsuite/test_evidence.py) and through the parity part (below)
def test_faulty_engine_fails_on_the_sanity_task(tmp_path):
    """stale_feedback on smollm2, 16 sanity items: measured 0.875 -> 0.1875 (b=11, c=0, exact one-sided
    p 0.0005; a FAIL needs b >= 6 with c = 0): FAIL, exit 1, and the text names the loss and the differing
    responses. (16 items, not 40: the same verdict in half the time.)"""
    p = cli("run", "sanity", "--model", "smollm2-135m", "--limit", "16", "--fault", "stale_feedback",
            "--output", str(tmp_path / "f"))
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stdout.startswith("FAIL") and "a loss is shown" in p.stdout and "warning: responses differ" in p.stdout


def test_a_fault_accuracy_misses_fails_through_the_parity_part(tmp_path):
    """attn_scale on mini-llama, 8 sanity items: no accuracy to lose (both engines score 0), but the parity part
    finds the engine's answers beyond the rule's bounds and FAILs the run, naming the item and position; the judge
    decoded only where its greedy answer parted from the engine's."""
    p = cli("run", "sanity", "--model", "mini-llama", "--limit", "8", "--fault", "attn_scale",
            "--output", str(tmp_path / "f"), "--json")
    assert p.returncode == 1, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["failed_by"] == ["parity"] and r["paired"]["b"] == 0
    pa = r["parity"]
    assert pa["judged"] and pa["items_failing"] > 0 and pa["first_failures"][0]["position"] >= 0
    w = r["judge_work"]
    assert w["mode"] == "scores" and w["judge_scored"] == w["engine_generated"] > 0
    assert w["judge_decoded"] < w["engine_generated"]
    t = cli("run", "sanity", "--model", "mini-llama", "--limit", "8", "--fault", "attn_scale",
            "--output", str(tmp_path / "f"))  # resumed from the journals: the text names the part and the item
    assert t.returncode == 1 and "FAIL through the parity part" in t.stdout and "position" in t.stdout


@pytest.mark.heavy  # CI reaches the same PASS through verify (tests/evalsuite/test_evidence.py, sanity, 240 items)
def test_faithful_engines_pass_the_full_sanity_task(tmp_path):
    """mini-llama, all 240 sanity items through both engines: nothing discordant on >= 183 items -> PASS, exit 0."""
    p = cli("run", "sanity", "--model", "mini-llama", "--output", str(tmp_path / "s"), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["verdict"] == "PASS" and r["items"] == 240 and r["paired"]["b"] == 0


def test_lm_eval_command_line_with_registered_models():
    p = cli("lm-eval", "--model", "evalsuite-reference", "--model_args", "model=mini-llama",
            "--tasks", "evalsuite_sanity", "--include_path", str(Path(__file__).parents[3] / "tasks"),
            "--limit", "2")  # sanity (0-shot, short answers): gsm8k's 5-shot, 256-token run through lm-eval took 39 s
    assert p.returncode == 0, p.stderr[-2000:]
    assert "evalsuite_sanity" in p.stdout and "exact_match" in p.stdout

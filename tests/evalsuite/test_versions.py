"""evalsuite.versions.commit: what every benchmark row records as the code it ran."""

import subprocess

from evalsuite.versions import commit


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_commit_is_dirty_for_changed_code_but_not_for_a_runs_own_results(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    (repo / "benchmarks" / "results" / "t.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                          text=True).stdout.strip()
    assert commit(repo / "benchmarks") == head
    (repo / "benchmarks" / "results" / "t.json").write_text('{"rows": []}\n')  # a run writing its table
    assert commit(repo / "benchmarks") == head
    (repo / "code.py").write_text("x = 2\n")
    assert commit(repo / "benchmarks") == head + "-dirty"
    outside = tmp_path / "plain"
    outside.mkdir()
    assert commit(outside) is None

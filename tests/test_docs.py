"""The docs: the generated tables equal what evalsuite.docgen makes from benchmarks/results/, and the README stays a
landing page (short, opening with the two fresh-machine commands, no commit hashes or dates, links that resolve)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evalsuite import docgen

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text("utf-8")
COMMANDS = ["bash install.sh && .venv/bin/evalsuite verify", "bash install.sh && .venv/bin/nox -s tests"]


@pytest.mark.parametrize("table", docgen.TABLES, ids=lambda t: t.name)
def test_generated_table_matches_its_json(table):
    text = (ROOT / table.page).read_text("utf-8")
    blocks = {m["name"]: m["body"] for m in docgen.BLOCK.finditer(text)}
    assert table.name in blocks, f"{table.page} has no <!-- generated: {table.name} --> block"
    assert blocks[table.name] == table.render(ROOT), (
        f"{table.name} in {table.page} is stale: run `python -m evalsuite.docgen`")


def test_every_generated_block_is_known():
    names = {t.name for t in docgen.TABLES}
    for page in sorted((ROOT / "docs").glob("*.md")):
        unknown = [m["name"] for m in docgen.BLOCK.finditer(page.read_text("utf-8")) if m["name"] not in names]
        assert not unknown, f"{page.name}: generated blocks no table renders: {unknown}"


def test_docgen_tolerates_rows_added_later(tmp_path):
    """A fault appended to a detection JSON without some rules' cells, and a missing file, render as 'not
    measured' rather than crash."""
    import json

    src = ROOT / docgen.RESULTS
    (tmp_path / docgen.RESULTS).mkdir(parents=True)
    doc = json.loads((src / "detection-float32.json").read_text("utf-8"))
    doc["rows"].append({"fault": "new_fault", "model": "smollm2-135m", "first_caught": {"evalsuite": 3}})
    (tmp_path / docgen.RESULTS / "detection-float32.json").write_text(json.dumps(doc))
    (tmp_path / docgen.RESULTS / "detection-bfloat16.json").write_text(json.dumps({"rows": [{"fault": "x"}]}))
    f32 = docgen.detection("float32")(tmp_path)
    row = "| new_fault | float32 | smollm2-135m | 3 |" + " not measured |" * 4
    assert row in f32
    assert "not measured" in docgen.detection("bfloat16")(tmp_path)
    assert "not measured" in docgen.gsm8k_full(tmp_path)
    assert "not measured" in docgen.f32_paths(tmp_path)
    assert "not measured" in docgen.drift_parts(tmp_path)


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = README.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; keep it a landing page (<= 250)"
    first = re.search(r"^```[^\n]*\n(.*?)^```", README, re.S | re.M)
    assert first is not None and first[1].splitlines() == COMMANDS, "README's first fenced block: the two commands"
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text("utf-8").splitlines()]
    ci = [ln for ln in ci if ln and not ln.startswith("#")]
    assert ci[-1] == COMMANDS[1], ".ci/run's last command must be the README's test command"


def test_readme_has_no_commit_hashes_or_dates():
    hexes = [t for t in re.findall(r"\b[0-9a-f]{7,40}\b", README)
             if re.search(r"[0-9]", t) and re.search(r"[a-f]", t)]
    assert not hexes, f"README.md names commit-like hashes {hexes}: history belongs in git and CHANGELOG.md"
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b", README)
    assert not dates, f"README.md has dates {dates}: state figures with their command in docs/ instead"


def _hashes_and_dates(text: str) -> list[str]:
    hexes = [t for t in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[0-9]", t) and re.search(r"[a-f]", t)]
    return hexes + re.findall(r"\b20\d\d-\d\d-\d\d\b", text)


def test_no_docstring_carries_a_commit_hash_or_a_date():
    """A docstring keeps the one-line reason and points to the doc with the measurement; history is in git."""
    import ast

    found = [f"{f.relative_to(ROOT)}:{getattr(node, 'lineno', 1)} {_hashes_and_dates(doc)}"
             for d in ("evalsuite", "engines", "benchmarks", "tasks", "examples")
             for f in sorted((ROOT / d).rglob("*.py"))
             for node in ast.walk(ast.parse(f.read_text("utf-8")))
             if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
             and (doc := ast.get_docstring(node)) and _hashes_and_dates(doc)]
    assert found == []


def test_readme_links_to_docs_resolve():
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", README)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_docs_links_between_pages_resolve():
    for page in sorted((ROOT / "docs").glob("*.md")):
        links = re.findall(r"\]\(([\w./-]+\.md)\)", page.read_text("utf-8"))
        missing = [link for link in links if not (page.parent / link).is_file()]
        assert not missing, f"{page.name} links to missing files: {missing}"

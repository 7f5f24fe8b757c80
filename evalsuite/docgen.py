"""Render the docs' figure tables from the committed JSON in benchmarks/results/ (and the fault catalogue):
`python -m evalsuite.docgen` rewrites every `<!-- generated: NAME -->` block, `--check` names the stale ones."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evalsuite.doctables import (
    RESULTS,
    detection,
    detection_accuracy,
    detection_run,
    diff_cost,
    false_alarms,
    fault_catalogue,
    gsm8k_full,
    judge_scoring,
    noise_floor,
    recipe_check,
    reference_accuracy,
)
from evalsuite.interop_tables import interop_capabilities, interop_commands
from evalsuite.speed_tables import decode_figures, judge_peak_figures, judge_profile_figures, spec_figures
from evalsuite.tpu_tables import (
    SEED_MINIS_PUBLIC,
    megakernel_diffs,
    megakernel_runs,
    seed_minis,
    tpu_roofline,
    tpu_runs,
    tpu_vmem,
)
from evalsuite.witness_tables import drift_parts, f32_paths, order_spread

ROOT = Path(__file__).resolve().parents[1]  # the checkout this module sits in (an editable install)
BLOCK = re.compile(r"<!-- generated: (?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /generated -->", re.S)


@dataclass(frozen=True)
class Table:
    """One generated block: its marker name, the docs page that holds it, and what renders it."""

    name: str
    page: str
    render: Callable[[Path], str]


TABLES = (
    Table("fault-catalogue", "docs/faults.md", fault_catalogue),
    Table("detection-float32", "docs/faults.md", detection("float32")),
    Table("detection-bfloat16", "docs/faults.md", detection("bfloat16")),
    Table("detection-accuracy-gpqa", "docs/faults.md", detection_accuracy("gpqa")),
    Table("detection-accuracy-gsm8k", "docs/faults.md", detection_accuracy("gsm8k")),
    Table("false-alarms", "docs/faults.md", false_alarms),
    Table("false-alarms-partial", "docs/faults.md", lambda root: false_alarms(root, f"{RESULTS}/partial")),
    Table("noise-floor-varied", "docs/calibration.md", noise_floor),
    Table("recipe-check", "docs/calibration.md", recipe_check("calibrate-recipe")),
    Table("recipe-check-spread", "docs/calibration.md", recipe_check("calibrate-recipe-spread")),
    Table("diff-cost", "docs/verdicts.md", diff_cost),
    Table("reference-accuracy", "docs/models.md", reference_accuracy),
    Table("gsm8k-full", "docs/benchmarks.md", gsm8k_full),
    Table("judge-scoring", "docs/benchmarks.md", judge_scoring),
    Table("decode", "docs/benchmarks.md", decode_figures),
    Table("judge-peak", "docs/benchmarks.md", judge_peak_figures),
    Table("judge-profile", "docs/benchmarks.md", judge_profile_figures),
    Table("speculative", "docs/speculative.md", spec_figures),
    Table("spec-faults", "docs/speculative.md", lambda root: fault_catalogue(root, "spec")),
    Table("detection-run-gsm8k", "docs/faults.md", detection_run("gsm8k")),
    Table("interop-capabilities", "docs/engines.md", interop_capabilities),
    Table("interop-commands", "docs/engines.md", interop_commands),
    Table("tpu-runs", "docs/tpu.md", tpu_runs),
    Table("tpu-roofline", "docs/tpu.md", tpu_roofline),
    Table("tpu-vmem", "docs/tpu.md", tpu_vmem),
    Table("megakernel-diffs", "docs/tpu.md", megakernel_diffs),
    Table("seed-minis", "docs/megakernel.md", seed_minis),
    Table("seed-minis-public", "docs/megakernel.md", lambda root: seed_minis(root, SEED_MINIS_PUBLIC)),
    Table("megakernel-runs", "docs/tpu.md", megakernel_runs),
    Table("f32-paths", "docs/faults.md", f32_paths),
    Table("drift-parts", "docs/rule.md", drift_parts),
    Table("order-spread", "docs/rule.md", order_spread),
)


def render_page(text: str, tables: dict[str, Table], root: Path) -> tuple[str, list[str]]:
    """The page with every generated block rendered again, and the names whose block changed or is unknown."""
    stale: list[str] = []

    def fill(m: re.Match) -> str:
        name = m["name"]
        if name not in tables:
            stale.append(f"{name} (no such table)")
            return m[0]
        body = tables[name].render(root)
        if body != m["body"]:
            stale.append(name)
        return f"<!-- generated: {name} -->\n{body}<!-- /generated -->"

    return BLOCK.sub(fill, text), stale


def run(root: Path, check: bool) -> tuple[list[str], list[str]]:
    """Rewrite (with check, only compare) every page that holds a generated table. Returns the tables whose
    block was stale (rewritten unless check) and the errors (a block missing, repeated or unknown), each naming
    its table and page."""
    stale, errors = [], []
    for page in sorted({t.page for t in TABLES}):
        path = root / page
        text = path.read_text("utf-8") if path.is_file() else ""
        mine = {t.name: t for t in TABLES if t.page == page}
        found = [m["name"] for m in BLOCK.finditer(text)]
        errors += [f"{n} ({page}: no block)" for n in mine if n not in found]
        errors += [f"{n} ({page}: {found.count(n)} blocks)" for n in mine if found.count(n) > 1]
        new, changed = render_page(text, mine, root)
        stale += [f"{n} ({page})" for n in changed if n in mine]
        errors += [f"{n} ({page})" for n in changed if n not in mine]
        if not check and new != text:
            path.write_text(new, "utf-8")
    return stale, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evalsuite.docgen", description=__doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale table")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: the one this module is in)")
    a = ap.parse_args(argv)
    if not (a.root / RESULTS).is_dir():
        ap.error(f"--root {a.root}: no {RESULTS}/ there (expected a checkout of evalsuite)")
    stale, errors = run(a.root, a.check)
    for name in stale:
        print(f"stale: {name}" if a.check else f"rewritten: {name}", file=sys.stderr if a.check else sys.stdout)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if errors or (a.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Verdicts and exit codes, defined once for every command.

PASS 0 (evidence that nothing was lost), FAIL 1 (a loss or a real mismatch is shown),
INCONCLUSIVE 3 (nothing failed, but something needed for a PASS was not shown or not checked);
usage errors exit 2 (evalsuite.cli).
"""

from __future__ import annotations

EXIT_CODES = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3}


def exit_code(verdict: str) -> int:
    return EXIT_CODES.get(verdict, 3)


def combine(verdicts) -> str:
    """FAIL if any part fails; else INCONCLUSIVE if any part is (or nothing was judged); else PASS."""
    vs = [v for v in verdicts if v != "SKIPPED"]
    if "FAIL" in vs:
        return "FAIL"
    if not vs or any(v != "PASS" for v in vs):
        return "INCONCLUSIVE"
    return "PASS"

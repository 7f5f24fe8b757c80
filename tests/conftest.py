"""Shared fixtures: models load once per test session."""

from __future__ import annotations

import os
import tempfile

import pytest

# One JAX persistent compilation cache for the whole test session, in-process and in the CLI
# subprocesses the tests start (they inherit the environment): the same programs compile once.
# A fresh folder per session, so no run depends on another's leftovers.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="evalsuite-jaxcache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


# Modules whose tests each run for tens of seconds (CLI subprocesses, whole runs). Collection puts them, and
# every `slow` test, first: pytest-xdist's worksteal then ends the session on short tests, instead of one worker
# finishing a two-minute test alone while the other idles.
LONG_MODULES = ("test_evidence.py", "test_serve.py", "test_run.py", "test_shard.py", "test_diff.py",
                "test_plugins.py", "test_distributed.py", "test_routing.py", "test_real_data.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        return 0 if item.get_closest_marker("slow") else 1 if item.path.name in LONG_MODULES else 2

    items.sort(key=rank)  # stable: the order inside each rank is kept


def pytest_addoption(parser):
    parser.addoption("--golden-update", action="store_true", default=False,
                     help="Rewrite golden/*.json from the reference instead of only checking them.")


@pytest.fixture(scope="session")
def smollm2():
    from evalsuite.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_ref(smollm2):
    from engines.reference import ReferenceEngine

    return ReferenceEngine(smollm2.weights)


@pytest.fixture(scope="session")
def mini_llama():
    from evalsuite.models import load_model

    return load_model("mini-llama")


@pytest.fixture(scope="session")
def mini_moe():
    from evalsuite.models import load_model

    return load_model("mini-moe")

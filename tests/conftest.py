"""Shared fixtures: models load once per test session."""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--golden-update", action="store_true", default=False,
                     help="Rewrite golden/*.json from the reference instead of only checking them.")


@pytest.fixture(scope="session")
def smollm2():
    from evalsuite.registry import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_ref(smollm2):
    from engines.reference import ReferenceEngine

    return ReferenceEngine(smollm2.weights)


@pytest.fixture(scope="session")
def mini_llama():
    from evalsuite.registry import load_model

    return load_model("mini-llama")


@pytest.fixture(scope="session")
def mini_moe():
    from evalsuite.registry import load_model

    return load_model("mini-moe")

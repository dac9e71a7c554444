"""Fixtures for the shim's CPU tests: the built stand-ins (session-wide) and a
per-test runner with its own fake GPU and region (see shimharness.py)."""

import pytest

from shimharness import Built, Shim, build_all


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    return build_all(tmp_path_factory)


@pytest.fixture
def shim(built, tmp_path) -> Shim:
    return Shim(built, tmp_path)

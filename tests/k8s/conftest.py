"""Fixtures for the Kubernetes tests: the stand-ins of tests/k8s."""

from __future__ import annotations

import pytest


@pytest.fixture
def api_server():
    """A running API-server stand-in (:mod:`apiserver`), bookmarks every 0.2 s."""
    from apiserver import ApiServer

    with ApiServer(bookmark_interval=0.2) as api:
        yield api

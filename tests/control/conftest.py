"""Fixtures for the control face's tests: the API-server stand-in of tests/k8s
(made importable here without touching tests/k8s) and a kubeconfig for it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_K8S = str(Path(__file__).resolve().parent.parent / "k8s")
if _K8S not in sys.path:
    sys.path.insert(0, _K8S)


@pytest.fixture
def api_server():
    """A running API-server stand-in (tests/k8s/apiserver.py), bookmarks every 0.2 s."""
    from apiserver import ApiServer

    with ApiServer(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture
def kubeconfig(api_server, tmp_path) -> str:
    return api_server.write_kubeconfig(tmp_path / "kubeconfig")

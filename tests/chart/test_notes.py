"""What ``helm install`` prints (NOTES.txt) gets a user with HAMi's helm-repo
habits to a running cluster: the image and the chart come from the checkout,
nothing is published, and where HAMi's values go."""

from __future__ import annotations

from pathlib import Path

import pytest

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra (make test installs it)")

CHART = Path(__file__).resolve().parents[2] / "charts" / "hamid"


def notes(values: dict) -> str:
    out = helm.Chart.load(str(CHART)).render(values, name="hamid", namespace="kube-system")
    return next(text for path, text in out.items() if path.endswith("NOTES.txt"))


def test_the_notes_say_where_the_image_and_the_chart_come_from():
    text = notes({"image": {"repository": "registry.example.com/hamid"}})
    assert "registry.example.com/hamid:0.1.0 is not published" in text and "docker build -t" in text
    assert "ImagePullBackOff" in text
    assert "helm repo add" in text and "helm upgrade hamid <checkout>/charts/hamid -n kube-system" in text
    assert "hamid config from-hami" in text and "docs/kubernetes.md" in text

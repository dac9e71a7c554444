"""The project's docs stand alone: nothing points outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|shared/reference|reference/[\w-]+\.md|(?<![\w/])DESIGN\.md")


def test_no_file_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    hits = []
    for name in files:
        if Path(name).suffix not in {".md", ".py", ".c", ".h", ".sh", ".yaml", ".toml"} or name == "tests/test_docs.py":
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{name}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_the_readme_points_at_the_design_in_this_repository():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/design.md)" in readme
    design = (ROOT / "docs" / "design.md").read_text()
    for folder in ("devices", "ledger", "placement", "node", "localapi", "docker", "peer", "gossip", "metrics",
                   "shimregion", "shimlimits", "shiminstall", "runtime"):
        assert f"hamid/{folder}/" in design, folder


RESULTS = ROOT / "bench" / "gpu" / "results"


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    keep = (".py", ".md", ".c", ".h", ".sh", ".cu", ".yaml", ".toml")
    return [ROOT / p for p in out.split() if p.endswith(keep) or "/standins/" in p]


def test_every_pointer_into_the_gpu_results_names_a_file_that_exists():
    # Results are indexed by topic (bench/gpu/results/<topic>/README.md); a pointer at a deleted run would send
    # a reader to nothing.
    missing = []
    for path in _tracked_text_files():
        if not path.is_file() or RESULTS in path.parents:
            continue
        for ref in re.findall(r"bench/gpu/results/[A-Za-z0-9_./*-]*[A-Za-z0-9_/]", path.read_text(errors="replace")):
            if "*" in ref or not (ROOT / ref).exists():
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, missing


def test_each_results_topic_has_a_readme_that_names_its_runs():
    # Each topic's README names its current reference runs; a summary committed without it is a loose notebook.
    topics = [d for d in RESULTS.iterdir() if d.is_dir()]
    assert topics, "no results topics"
    assert (RESULTS / "README.md").is_file()
    for topic in topics:
        readme = topic / "README.md"
        assert readme.is_file(), f"{topic.name}/ has no README.md"
        text = readme.read_text()
        assert topic.name in (RESULTS / "README.md").read_text(), f"the index does not list {topic.name}/"
        for run in topic.glob("*.md"):
            if run.name != "README.md":
                assert run.name in text, f"{topic.name}/README.md does not name {run.name}"
    assert not [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"], "runs outside a topic"


def test_the_readme_alone_says_how_to_build_the_image_offline_and_install_without_a_chart_repository():
    """No image or chart is published: the README's install section must say how to build offline
    (the steps tests/image/test_image.py runs: wheels in .whl/, the index off, the base image loaded)
    and what replaces `helm repo add`."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Installing on Kubernetes"):readme.index("### Kubernetes on the node")]
    for step in ("python3 -m pip wheel --wheel-dir .whl . setuptools wheel", "docker load -i base.tar",
                 "--build-arg PIP_NO_INDEX=1", "helm install hamid ./charts/hamid", "helm repo add",
                 "oci://", "hamid config from-hami"):
        assert step in section, step

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

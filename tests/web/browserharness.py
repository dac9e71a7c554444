"""A real headless Chromium for the web view's tests, and axe-core to audit pages.

Chromium is Debian's ``chromium`` (tests/prepare_host.py installs it), driven
by Playwright for Python with ``executable_path``: Playwright's own browser
download is never used. axe-core comes from the npm registry
(``npm install axe-core``, once per session into a temporary folder) and is
evaluated in the page through the DevTools protocol, so the page's Content
Security Policy (scripts from the daemon only) stays on while it runs.

Every page opened through :func:`open_page` records console errors and
uncaught exceptions; :func:`no_errors` asserts there were none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "web"
AXE_VERSION = "4.10"  # the major.minor audited against; npm picks its newest patch


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on PATH (make test installs Debian's chromium through tests/prepare_host.py)")


def launch(playwright):
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses to run as root
    return playwright.chromium.launch(executable_path=chromium_path(), args=args)


def axe_source(tmp_dir: Path) -> str:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("no npm (make test installs it through tests/prepare_host.py) for axe-core")
    r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(tmp_dir),
                        f"axe-core@~{AXE_VERSION}"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"npm install axe-core failed: {r.stderr[-2000:]}")
    return (tmp_dir / "node_modules" / "axe-core" / "axe.min.js").read_text()


def open_page(browser, url: str, **context):
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    page.errors = []  # type: ignore[attr-defined]
    page.on("console", lambda m: page.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(f"uncaught: {e}"))
    page.goto(url)
    page.wait_for_selector("body[data-rendered='1']", timeout=15000)
    return page


def no_errors(page) -> None:
    assert page.errors == [], page.errors


def axe_violations(page, source: str) -> list[dict]:
    """axe-core's violations on the page as it is (WCAG 2 A and AA rules)."""
    page.evaluate(source)
    got = page.evaluate("""async () => {
        const r = await axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21aa']}});
        return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                       nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}));
    }""")
    return json.loads(json.dumps(got))


def screenshot(page, name: str) -> Path:
    DOCS.mkdir(parents=True, exist_ok=True)
    path = DOCS / name
    page.screenshot(path=str(path), full_page=True)
    return path

"""The layer rules docs/design.md states, read off hamid/'s imports (AST), so they cannot quietly break.

- **Core** (the node's authority and the pure engines) imports only core and
  the shared libraries below it, never the config schema, a face or a program.
- **Shared libraries** never import a face or a program.
- **Faces** (the doors into the node service) import core and shared
  libraries, never another face or a program (the CLI, the daemon, the runtime).
- **Programs** assemble the rest.
- No cycle between packages, counting imports inside functions too: an import
  moved into a function to dodge a cycle still counts.
Every package of hamid/ has a layer here; a new one fails this test until it is given one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hamid"

CORE = {"node", "ledger", "placement", "devices", "request", "shimlimits", "shimregion", "shiminstall"}
SHARED = {"errors", "logs", "serving", "dirwatch", "nodekey", "keyring", "netaddr", "cborcheck", "cluster",
          "config", "kube", "hamimetrics", "buildinfo", "atomicfile", ""}  # "" is hamid/__init__.py (the version)
FACES = {"kubelet", "scheduling", "webhook", "docker", "localapi", "peer", "gossip", "web", "metrics", "dra"}
PROGRAMS = {"daemon", "cli", "runtime"}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports() -> list[tuple[str, str, str, int]]:
    """(importing package, imported package, file, line) for every import of hamid's own modules."""
    out = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts)
        is_pkg = path.name == "__init__.py"
        if is_pkg:
            module = module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                else:
                    targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t == "hamid" or t.startswith("hamid."):
                    src, dst = _package(module), _package(t)
                    if src != dst:
                        out.append((src, dst, str(path.relative_to(ROOT.parent)), node.lineno))
    return out


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages |= {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    unknown = packages - CORE - SHARED - FACES - PROGRAMS
    assert not unknown, f"give these packages a layer in tests/test_layers.py (and docs/design.md): {unknown}"


def test_imports_go_one_way():
    bad = []
    for src, dst, where, line in _imports():
        if src in CORE and dst not in CORE | SHARED - {"config", "cluster"}:
            bad.append(f"{where}:{line}: core package {src} imports {dst}")
        elif src in SHARED and dst in FACES | PROGRAMS:
            bad.append(f"{where}:{line}: shared library {src} imports {dst}")
        elif src in FACES and dst in FACES | PROGRAMS:
            bad.append(f"{where}:{line}: face {src} imports {dst}")
    assert not bad, "\n".join(bad)


def test_faces_reach_the_node_through_its_service():
    """No face imports the ledger or the node core: the node service (and the
    types it re-exports) is the only door, so every change is announced."""
    bad = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent)
        if rel.parts[1] not in FACES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    base = list(rel.with_suffix("").parts[:-1])
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([mod] if mod else []))
                if mod == "hamid.ledger" or mod.startswith("hamid.ledger.") or mod == "hamid.node.core" or (
                        mod == "hamid.node" and any(a.name == "core" for a in node.names)):
                    bad.append(f"{rel}:{node.lineno}: face imports {mod}")
            elif isinstance(node, ast.Attribute) and node.attr == "core" and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "node":
                bad.append(f"{rel}:{node.lineno}: face reaches self.node.core")
    assert not bad, "\n".join(bad)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in _imports():
        graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(n: str, path: list[str]) -> bool:
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycle.extend(path[path.index(m):] + [m] if m in path else [n, m])
                return True
            if state.get(m) is None and visit(m, path + [m]):
                return True
        state[n] = 2
        return False

    for n in sorted(graph):
        if state.get(n) is None and visit(n, [n]):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_rules_catch_what_they_claim(tmp_path):
    """The checker itself: a face importing another face, and a cycle, are found."""
    global ROOT
    fake = tmp_path / "hamid"
    for pkg, body in (("peer", "from ..gossip import x\n"), ("gossip", "x = 1\n"),
                      ("node", "def f():\n    from ..ledger import y\n"), ("ledger", "from ..node import z\n")):
        (fake / pkg).mkdir(parents=True)
        (fake / pkg / "__init__.py").write_text(body)
    (fake / "__init__.py").write_text("")
    ROOT, saved = fake, ROOT
    try:
        imports = _imports()
        assert ("peer", "gossip", "hamid/peer/__init__.py", 1) in imports
        bad_face = [i for i in imports if i[0] in FACES and i[1] in FACES]
        assert bad_face
        try:
            test_no_cycle_between_packages()
        except AssertionError as e:
            assert "node" in str(e) and "ledger" in str(e)
        else:
            raise AssertionError("the cycle node -> ledger -> node was not found")
    finally:
        ROOT = saved

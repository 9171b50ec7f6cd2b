"""The house rules of docs/architecture.md, checked on the source: who may import whom, file sizes.

Arrows point down to the core. A change that needs an arrow the other way fails here, which is the
point: the design is then wrong, or the page (and this table) must change with a reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "pollux"

#: Part → the Pollux parts it may import (itself always allowed). Lazy imports inside functions count.
ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "datasets": set(),
    "durable": set(),
    "goodput": set(),
    "balance": {"goodput"},
    "hints": {"goodput", "contract"},
    "raylink": {"contract"},
    "policy": {"goodput"},
    "sim": {"goodput", "balance", "policy"},
    "torch": {"goodput", "balance", "hints", "contract", "durable"},
    "cluster": {"goodput", "policy", "hints", "contract", "raylink"},
    "litz": {"contract", "datasets", "durable", "hints", "raylink"},
    "scar": {"contract", "datasets", "durable", "litz"},
    "hpo": {"cluster", "contract"},
    "cli": {"goodput", "policy", "sim", "cluster", "hints", "contract", "raylink", "litz", "scar", "hpo"},
}
#: Third-party packages a part must never import: the service and the core run without torch.
FORBIDDEN_THIRD_PARTY: dict[str, set[str]] = {
    "contract": {"torch", "numpy", "ray", "fastapi"},
    "datasets": {"torch", "ray", "fastapi"},
    "durable": {"torch", "numpy", "ray", "fastapi"},
    "goodput": {"torch", "ray", "fastapi"},
    "balance": {"torch", "ray", "fastapi"},
    "hints": {"torch", "ray"},
    "raylink": {"torch", "numpy", "fastapi"},
    "policy": {"torch", "ray", "fastapi"},
    "sim": {"torch", "ray", "fastapi"},
    "cluster": {"torch"},
    "litz": {"fastapi"},
    "scar": {"fastapi"},
    "hpo": {"torch", "ray", "fastapi"},
    "cli": {"torch"},
}
#: A module past this many lines holds more than one concern: split it by what it holds.
MAX_LINES = 500
#: A class past this many lines does more than one thing: give each concern a class of its own.
MAX_CLASS_LINES = 300
#: What is still over (issue 34's remaining work), each with the size it may not grow past. An entry
#: is removed when its split lands; a new file or class over the limit fails at once.
KNOWN_LONG_FILES: dict[str, int] = {}
KNOWN_LONG_CLASSES: dict[str, int] = {}


def _part(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py") if rel.parts else ""


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p.name != "__init__.py" or p.parent != SRC)


def test_every_part_is_known():
    parts = {_part(p) for p in _sources()} - {"__main__", "_version", "__init__"}
    assert parts <= set(ALLOWED), f"parts without import rules: {sorted(parts - set(ALLOWED))}"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_point_down(part):
    bad = []
    for path in _sources():
        if _part(path) != part:
            continue
        for line, module in _imports(path):
            top, _, rest = module.partition(".")
            if top == "pollux" and rest:
                target = rest.split(".")[0]
                if target != part and target not in ALLOWED[part]:
                    bad.append(f"{path.relative_to(SRC.parent)}:{line} imports {module}")
            elif top in FORBIDDEN_THIRD_PARTY.get(part, set()):
                bad.append(f"{path.relative_to(SRC.parent)}:{line} imports {module}")
    assert not bad, "imports against docs/architecture.md:\n" + "\n".join(bad)



#: The Litz modules another part may import: its public face and the protocols of its seams.
LITZ_PUBLIC = {"pollux.litz", "pollux.litz.api"}


def test_scar_uses_only_litz_s_public_face():
    """SCAR plugs into Litz through the `FaultTolerance` seam; Litz's insides may change freely."""
    bad = []
    for path in _sources():
        if _part(path) != "scar":
            continue
        for line, module in _imports(path):
            if module.startswith("pollux.litz") and module not in LITZ_PUBLIC:
                bad.append(f"{path.relative_to(SRC.parent)}:{line} imports {module}")
    assert not bad, "SCAR reaches into Litz's insides:\n" + "\n".join(bad)

def test_no_source_file_over_the_limit():
    long = []
    for path in _sources():
        name = str(path.relative_to(SRC.parent))
        lines = len(path.read_text().splitlines())
        if lines > KNOWN_LONG_FILES.get(name, MAX_LINES):
            long.append(f"{name}: {lines} lines")
    assert not long, f"split by what they hold (limit {MAX_LINES}):\n" + "\n".join(long)


def test_no_class_over_the_limit():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                name = f"{path.relative_to(SRC.parent)}:{node.name}"
                lines = node.end_lineno - node.lineno + 1
                if lines > KNOWN_LONG_CLASSES.get(name, MAX_CLASS_LINES):
                    long.append(f"{name}: {lines} lines")
    assert not long, f"give each concern a class of its own (limit {MAX_CLASS_LINES}):\n" + "\n".join(long)


def test_the_known_long_entries_are_still_long():
    """An entry whose split has landed leaves the lists (so the limit applies to it again)."""
    sizes = {str(p.relative_to(SRC.parent)): len(p.read_text().splitlines()) for p in _sources()}
    stale = [f for f in KNOWN_LONG_FILES if sizes.get(f, 0) <= MAX_LINES]
    classes = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                classes[f"{path.relative_to(SRC.parent)}:{node.name}"] = node.end_lineno - node.lineno + 1
    stale += [c for c in KNOWN_LONG_CLASSES if classes.get(c, 0) <= MAX_CLASS_LINES]
    assert not stale, f"no longer over the limit; remove from the known lists: {stale}"


#: Inside ``pollux.cluster``: room → the rooms it may import. What is kept knows nothing of the loop,
#: the backends or HTTP; the backends know the job spec; the loop and the HTTP side sit on both. The
#: web view reads what is kept and reuses the loop's outlook; the HTTP side mounts it (so the web view
#: gets its viewers from the API's rules as a function, and never imports the API). The entry points
#: beside the rooms (``server``, ``service``, ``demo`` and the Python ``client``) may import any room.
CLUSTER_ROOMS: dict[str, set[str]] = {
    "state": set(),
    "backends": {"state"},
    "control": {"state", "backends"},
    "web": {"state", "backends", "control"},
    "api": {"state", "backends", "web"},
}
CLUSTER = SRC / "cluster"


def _cluster_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["pollux", "cluster"] else None


def test_every_cluster_module_lives_in_a_room_or_is_an_entry_point():
    loose = sorted(p.name for p in CLUSTER.glob("*.py") if p.name != "__init__.py")
    assert loose == ["client.py", "demo.py", "server.py", "service.py"], loose
    rooms = sorted(p.name for p in CLUSTER.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert rooms == sorted(CLUSTER_ROOMS)


@pytest.mark.parametrize("room", sorted(CLUSTER_ROOMS))
def test_cluster_rooms_import_only_the_rooms_below_them(room):
    bad = []
    for path in sorted((CLUSTER / room).glob("*.py")):
        for line, module in _imports(path):
            target = _cluster_room(module)
            if target is not None and target != room and target not in CLUSTER_ROOMS[room]:
                bad.append(f"{path.relative_to(SRC.parent)}:{line} imports {module}")
    assert not bad, "imports against the rooms of docs/architecture.md:\n" + "\n".join(bad)


def test_every_module_the_architecture_page_names_exists():
    """The walk-throughs and tables of docs/architecture.md name modules; a rename must update them."""
    root = SRC.parents[1]
    doc = (root / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*\.py)`", doc))
    assert len(named) > 50
    missing = []
    for name in sorted(named):
        rel = name.removeprefix("pollux/")
        places = [SRC / rel, root / name, root / "tests" / name]
        if not any(p.exists() for p in places) and not any(SRC.rglob(rel)):
            missing.append(name)
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"

"""The layout docs/architecture.md promises: no import cycle inside the app (imports inside
functions counted), no class with its in-app bases over a ratchet, and threads started in four places only (the
keeper, the audit writer, the LISTEN thread, the SIGTERM hand-off; ``ResourceHolder`` is a
Thread itself)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "resource_lease"
#: A ratchet: the longest class with its in-app bases today is ``ProxyHolder`` on
#: ``ResourceHolder`` (652 lines); the MySQL dialect was 1,055 before the dialects composed
#: their statement parts, and is 489.
MAX_CLASS_LINES = 660
THREAD_SITES = {"keeper.py", "audit.py", "db/listen.py", "shutdown.py"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in APP.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(APP.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The app's modules ``path`` imports, when it is imported or later: imports inside
    functions count (a cycle put off until a call is a cycle all the same), those under
    ``if TYPE_CHECKING`` do not (they never run). ``from package import module`` imports that
    module (and its package's ``__init__``, which is how packages work), not every name of
    the package."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    imported: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                for alias in node.names
            ]
        imported.update(name for name in names if name in modules)
    return imported


def import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for other in sorted(graph[name]):
            # A package's __init__ importing its own modules is how packages work.
            if name != other and other.startswith(name + "."):
                continue
            if state.get(other) == 1:
                cycles.append(stack[stack.index(other) :] + [other])
            elif other not in state:
                visit(other)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return cycles


def test_the_app_has_no_import_cycle() -> None:
    assert import_cycles(_modules()) == []


def test_negative_control_a_cycle_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from a import x\n")
    modules = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    assert import_cycles(modules) == [["a", "b", "a"]]


def test_negative_control_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def later():\n    from a import x\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    (tmp_path / "d.py").write_text("import c\n")
    modules = {name: tmp_path / f"{name}.py" for name in "abcd"}
    assert import_cycles(modules) == [["a", "b", "a"]]  # c's import of a never runs


def class_lines(paths: list[Path]) -> dict[str, int]:
    """Each class's lines together with those of its bases defined in the app, recursively
    (``path.py:line Name``): a class split into a chain of bases is as long to read as it was
    whole. A base is found by name, in the class's own module first (two classes of the app
    share a name: the longer is taken)."""
    found: dict[str, list[tuple[str, int, int, list[str]]]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base).split("[")[0].split(".")[-1] for base in node.bases]
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.setdefault(node.name, []).append((path.name, node.lineno, lines, bases))

    def total(name: str, module: str, seen: frozenset[str]) -> int:
        candidates = found.get(name, [])
        if not candidates:
            return 0  # not the app's (Django's, the standard library's)
        here = [c for c in candidates if c[0] == module]
        _, _, lines, bases = here[0] if here else max(candidates, key=lambda c: c[2])
        own = module if here else max(candidates, key=lambda c: c[2])[0]
        return lines + sum(total(base, own, seen | {name}) for base in bases if base not in seen)

    return {
        f"{module}:{lineno} {name}": total(name, module, frozenset())
        for name, candidates in found.items()
        for module, lineno, _, _ in candidates
    }


def long_classes(paths: list[Path]) -> list[str]:
    return [
        f"{where} ({lines} lines with its bases)"
        for where, lines in class_lines(paths).items()
        if lines > MAX_CLASS_LINES
    ]


def test_no_class_with_its_bases_is_over_the_ratchet(tmp_path: Path) -> None:
    """A class is measured with its in-app bases (issue 38: a cap on classes alone made
    chains of bases with upward stubs). The bound is a ratchet at today's longest
    (``MAX_CLASS_LINES``): it only comes down."""
    lines = class_lines(list(_modules().values()))
    print("longest classes with their bases:", sorted(lines.items(), key=lambda kv: -kv[1])[:5])
    assert long_classes(list(_modules().values())) == []
    # Negative controls: one long class, and two classes each under the bound whose chain is over it.
    long = tmp_path / "long.py"
    long.write_text("class Long:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert long_classes([long]) == [f"long.py:1 Long ({MAX_CLASS_LINES + 1} lines with its bases)"]
    half = MAX_CLASS_LINES // 2 + 1
    chain = tmp_path / "chain.py"
    chain.write_text("class Base:\n" + "    x = 1\n" * half + "class Leaf(Base):\n" + "    y = 2\n" * half)
    assert long_classes([chain]) == [f"chain.py:{half + 2} Leaf ({2 * (half + 1)} lines with its bases)"]


def test_threads_are_started_in_four_places_only() -> None:
    sites = {}
    for path in APP.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bThread\(", line) and not line.lstrip().startswith("#"):
                sites[f"{path.relative_to(APP)}:{number}"] = line.strip()
    assert {site.rsplit(":", 1)[0] for site in sites} == THREAD_SITES, sites
    assert len(sites) == len(THREAD_SITES), sites

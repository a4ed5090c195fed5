"""The layout's figures for a checkout (issue 38's before and after), read from the source:

    python scripts/layout_figures.py [CHECKOUT]     # default: this one

- the app's lines (with and without migrations);
- the line of waiters: its modules and lines;
- modules outside ``db/`` and ``line/`` that run the PostgreSQL hand-off (its identifiers);
- run-time import circles, imports inside functions counted (not under ``if TYPE_CHECKING``;
  ``from package import module`` counts as the module), as tests/test_layout.py counts them;
- the longest classes measured with their in-package bases;
- the README's and docs/'s lines and words.

Prints figures; judges nothing (``duplicates --repo resource_lease`` gives the duplicate pairs).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.test_layout import _imports as imports  # noqa: E402 (the layout test's own count)

HAND_OFF = re.compile(
    r"handed_to|hands_off|claim_handed|give_back_handed|handoff|claiming\(|turn\.claim|\bmake=|making\("
)
LINE_MODULES = (
    "line.py line_stats.py leaving.py wakeups.py waiting.py wait_stats.py aio.py db/line.py db/line_operations.py"
)


def count_lines(paths: list[Path]) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    app = root / "resource_lease"
    files = sorted(p for p in app.rglob("*.py") if "__pycache__" not in p.parts)
    code = [p for p in files if "migrations" not in p.parts]
    print(f"app lines: {count_lines(files)} ({count_lines(code)} without migrations), {len(files)} files")

    if (app / "line").is_dir():
        line = [p for p in (app / "line").rglob("*.py") if "__pycache__" not in p.parts]
        line += [app / m for m in ("db/line.py", "db/line_operations.py", "aio.py") if (app / m).exists()]
    else:
        line = [app / m for m in LINE_MODULES.split() if (app / m).exists()]
    print(f"the line: {len(line)} modules, {count_lines(line)} lines")

    outside = sorted(
        str(p.relative_to(app))
        for p in code
        if p.relative_to(app).parts[0] not in ("db", "line") and p.name != "line.py" and HAND_OFF.search(p.read_text())
    )
    print(f"modules outside db/ and the line with hand-off code: {len(outside)} {outside}")

    modules = {module_name(root, p): p for p in code}
    graph = {m: imports(p, modules) - {m} for m, p in modules.items()}
    components = circles(graph)
    print(f"run-time import circles: {len(components)}, {sum(map(len, components))} modules")
    for component in components:
        print("   ", component)

    classes: dict[str, tuple[int, list[str]]] = {}
    for path in code:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                classes.setdefault(node.name, ((node.end_lineno or node.lineno) - node.lineno + 1, bases))

    def with_bases(name: str, seen: tuple[str, ...] = ()) -> int:
        if name not in classes or name in seen:
            return 0
        own, bases = classes[name]
        return own + sum(with_bases(b, (*seen, name)) for b in bases)

    longest = sorted(((with_bases(n), n) for n in classes), reverse=True)[:3]
    print("longest classes with their in-package bases:", ", ".join(f"{n} {size}" for size, n in longest))

    readme = (root / "README.md").read_text()
    docs = [p.read_text() for p in (root / "docs").glob("*.md")]
    print(f"README: {len(readme.splitlines())} lines, {len(readme.split())} words")
    print(f"docs/*.md: {sum(len(d.splitlines()) for d in docs)} lines, {sum(len(d.split()) for d in docs)} words")


if __name__ == "__main__":
    main()

"""The oldest Python the app runs on is stated once, as pyproject.toml's ``requires-python``.

vermin (https://github.com/netromdk/vermin) reads the code and says which Python it needs;
that must be exactly the floor pyproject states: no lower (users on it would crash on
``datetime.UTC``), no higher (it would turn users away for nothing). Everything else that
states the floor (scripts/bootstrap, the README, ruff's and mypy's targets, the classifiers)
reads it from pyproject or agrees with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The code whose needs set the floor: the app, the demo project, the Python scripts.
CODE = [ROOT / "resource_lease", ROOT / "project", *sorted((ROOT / "scripts").glob("*.py"))]
VERMIN = Path(sys.executable).with_name("vermin")

Version = tuple[int, int]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requires_python(project: dict[str, Any] | None = None) -> Version:
    """pyproject's ``requires-python``, which must read ``>=3.N``."""
    spec = (project or pyproject())["project"]["requires-python"]
    match = re.fullmatch(r">=\s*3\.(\d+)", spec.strip())
    assert match, f'requires-python should be a plain floor, ">=3.N"; it is {spec!r}'
    return 3, int(match[1])


def _version(text: str) -> Version:
    match = re.fullmatch(r"[~!]?3(?:\.(\d+))?", text)
    assert match, f"not a Python 3 version from vermin: {text!r}"
    return 3, int(match[1] or 0)


def needed(paths: list[Path]) -> tuple[Version, list[str]]:
    """The oldest Python 3 that runs ``paths`` according to vermin, and the findings (file,
    line, feature) that require exactly that version."""
    result = subprocess.run(
        [str(VERMIN), "--no-config-file", "--no-tips", "--format", "parsable", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"vermin failed:\n{result.stdout}\n{result.stderr}"
    # One finding per line, "path:line:column:py2:py3:feature" (notes have no versions); the
    # last line, with no path, is the minimum over every file.
    rows = [row for line in result.stdout.splitlines() if len(row := line.split(":", 5)) == 6 and row[4]]
    unreadable = [":".join(row) for row in rows if row[5].startswith("error:")]
    assert not unreadable, f"vermin could not read some code: {unreadable}"
    assert rows and rows[-1][0] == "", f"no overall minimum in vermin's output:\n{result.stdout}"
    minimum = _version(rows[-1][4])
    why = [
        f"{Path(row[0]).relative_to(ROOT) if Path(row[0]).is_relative_to(ROOT) else row[0]}:{row[1]} {row[5]}"
        for row in rows[:-1]
        if row[5] and _version(row[4]) == minimum
    ]
    return minimum, why


def floor_problems(paths: list[Path], floor: Version) -> list[str]:
    """Why ``floor`` (requires-python) is not what ``paths`` need; empty when it is."""
    minimum, why = needed(paths)
    shown = "; ".join(why[:5]) + ("; ..." if len(why) > 5 else "")
    if minimum > floor:
        return [
            f"the code needs Python {minimum[0]}.{minimum[1]} ({shown}), but requires-python says >={floor[0]}.{floor[1]}"
        ]
    if minimum < floor:
        return [
            f"requires-python says >={floor[0]}.{floor[1]}, but the code runs on Python {minimum[0]}.{minimum[1]}"
            f" ({shown or 'nothing newer found'}): a floor above what the code needs turns users away"
        ]
    return []


def test_vermin_is_pinned_and_installed() -> None:
    pinned = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("vermin==")]
    assert pinned, "requirements.txt should pin vermin"
    assert VERMIN.is_file(), f"{VERMIN} is missing: scripts/bootstrap installs requirements.txt"


def test_requires_python_is_what_the_code_needs() -> None:
    assert floor_problems(CODE, requires_python()) == []


def test_code_needing_a_newer_python_fails_the_check(tmp_path: Path) -> None:
    # Negative control: one module using 3.12-only features (a type statement, itertools.batched).
    newer = tmp_path / "newer.py"
    newer.write_text(
        "import itertools\n\ntype Pairs = list[tuple[int, int]]\nprint(list(itertools.batched([1, 2, 3], 2)))\n"
    )
    problems = floor_problems([*CODE, newer], requires_python())
    assert len(problems) == 1 and "needs Python 3.12" in problems[0] and "newer.py" in problems[0], problems


def test_a_floor_above_what_the_code_needs_fails_the_check(tmp_path: Path) -> None:
    # Negative control the other way: code that runs on 3.6 does not justify a 3.11 floor.
    older = tmp_path / "older.py"
    older.write_text('name = "x"\nprint(f"{name}")\n')
    problems = floor_problems([older], requires_python())
    assert len(problems) == 1 and "runs on Python 3.6" in problems[0], problems


# -- everything else that states the floor -------------------------------------------------


def _bootstrap_floor_check() -> str:
    """The part of scripts/bootstrap that reads the floor and checks $PYTHON against it."""
    text = (ROOT / "scripts" / "bootstrap").read_text()
    return text[text.index("PYTHON=${PYTHON:-python3}") : text.index("\nhave_mysql_headers")]


def _run_bootstrap_check(cwd: Path) -> subprocess.CompletedProcess[str]:
    script = f'set -euo pipefail\n{_bootstrap_floor_check()}\necho "floor $floor"\n'
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bootstrap_reads_the_floor_from_pyproject(tmp_path: Path) -> None:
    check = _bootstrap_floor_check()
    assert not re.search(r"\b3\.\d+\b|\(3, *\d+\)", check), "scripts/bootstrap states a Python version of its own"
    floor = requires_python()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    ok = _run_bootstrap_check(tmp_path)
    assert ok.returncode == 0 and ok.stdout.strip() == f"floor {floor[0]}.{floor[1]}", ok
    # Negative control: a floor above the running Python stops the bootstrap, naming it.
    (tmp_path / "pyproject.toml").write_text('[project]\nrequires-python = ">=3.99"\n')
    refused = _run_bootstrap_check(tmp_path)
    assert refused.returncode == 1 and "Python 3.99 or newer is needed" in refused.stderr, refused


def test_readme_states_the_same_floor() -> None:
    floor = "{}.{}".format(*requires_python())
    stated = re.findall(r"Python (\d+\.\d+)(?:\+| or newer| or later)", (ROOT / "README.md").read_text())
    assert stated, "the README should say which Python it needs"
    assert set(stated) == {floor}, f"the README states Python {sorted(set(stated))}, pyproject {floor}"


def test_tools_and_classifiers_target_the_floor() -> None:
    project = pyproject()
    major, minor = requires_python(project)
    assert project["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert project["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    listed = sorted(
        _version(c.rsplit("::", 1)[1].strip())
        for c in project["project"]["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert listed and listed[0] == (major, minor), f"the lowest Python classifier is {listed[:1]}, not {major}.{minor}"

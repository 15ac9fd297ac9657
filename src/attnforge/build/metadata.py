"""What a source tree says it is: its project name, read statically before anything is built.

``attnforge build --source DIR`` and ``install --source DIR`` name the build after the project, not after the
directory (a tree checked out as ``src/`` is still ``af-ext-fixture``), so both verbs, the cache entry and the
recorded build times agree on one name. The read is static (no PEP 517 hook runs, nothing is imported) and in
the order setuptools itself takes them: ``pyproject.toml`` ``[project] name`` (PEP 621), ``setup.cfg``
``[metadata] name``, then the ``name=`` keyword of the ``setup()`` call in ``setup.py`` (a string literal, or a
module-level name bound to one, as flash-attention's ``name=PACKAGE_NAME``). A name computed at run time is not
guessed: the caller falls back to the location's leaf.

Sources: PEP 621 (https://peps.python.org/pep-0621/#name); setuptools' declarative config
(https://setuptools.pypa.io/en/latest/userguide/declarative_config.html#metadata).
"""

from __future__ import annotations

import ast
import configparser
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def declared_name(tree: Path) -> str | None:
    """The project name ``tree`` declares (as written, not normalised), or None when none can be read.

    Args:
        tree: a source directory (the one holding ``pyproject.toml`` / ``setup.py``).

    Never raises: an unreadable or malformed file reads as "no name there".
    """
    for read in (_pyproject_name, _setup_cfg_name, _setup_py_name):
        try:
            name = read(tree)
        except (OSError, ValueError, SyntaxError, configparser.Error, tomllib.TOMLDecodeError):
            name = None
        if name:
            return name
    return None


def _pyproject_name(tree: Path) -> str | None:
    path = tree / "pyproject.toml"
    if not path.is_file():
        return None
    with path.open("rb") as fh:
        project = tomllib.load(fh).get("project")
    name = project.get("name") if isinstance(project, dict) else None
    return name if isinstance(name, str) else None


def _setup_cfg_name(tree: Path) -> str | None:
    path = tree / "setup.cfg"
    if not path.is_file():
        return None
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path, encoding="utf-8")
    name = parser.get("metadata", "name", fallback=None)
    return name.strip() or None if name else None


def _setup_py_name(tree: Path) -> str | None:
    path = tree / "setup.py"
    if not path.is_file():
        return None
    module = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    constants: dict[str, str] = {}
    for stmt in module.body:  # NAME = "text" at module level
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
            constants[stmt.targets[0].id] = stmt.value.value
    for node in ast.walk(module):
        if not (isinstance(node, ast.Call) and _callee(node.func) == "setup"):
            continue
        for kw in node.keywords:
            if kw.arg != "name":
                continue
            if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                return kw.value.value
            if isinstance(kw.value, ast.Name):
                return constants.get(kw.value.id)
    return None


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None

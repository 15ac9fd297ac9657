"""The import graph of src/attnforge obeys the layer table of docs/architecture.md.

Every import of every module is read with ``ast`` (module level, function level and ``TYPE_CHECKING`` alike):
no cycle between top-level packages, and no arrow from a lower layer to a higher one. A package named in the
table that does not exist yet (``backends/`` before its branch lands) is simply skipped.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "attnforge"
DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"

#: Low to high: a package may import only packages listed before it. Keep in step with docs/architecture.md.
LAYERS: tuple[str, ...] = (
    "_compat",       # Python-version shims (StrEnum on 3.10); imports nothing from attnforge
    "types",         # value types: compute capability, versions, device key, shapes
    "errors",        # the error hierarchy (message + hint + exit code)
    "_serde",        # dataclass <-> JSON
    "_system",       # the seams to the OS: subprocess runner, paths
    "catalog",       # knowledge as data (catalog/data/*.toml)
    "probe",         # reading the machine into a SystemSnapshot
    "records",       # what verify proved and bench measured (SQLite)
    "ranking",       # the one "which backend is fastest" rule, over records
    "diagnose",      # cause and fix of a failed build/import log
    "resolve",       # snapshot + catalog + request -> plan
    "fetch",         # the network side of prebuilt wheels: listings (cached) and downloads
    "cache",         # content-addressed store of built wheels
    "build",         # executing a BuildSpec
    "cargo",         # Rust (candle) builds
    "install",       # putting a wheel into the environment
    "fleet",         # the same over a Ray cluster: kinds, plan, builds as Ray tasks, index, rollout
    "backends",      # adapters + capability tables of each kernel (dispatch branch)
    "verify",        # numerical checks against a float64 reference
    "bench",         # timing
    "dispatch",      # the runtime: attention() and its policy
    "integrations",  # transformers / diffusers glue
    "report",        # doctor and the human renderings
    "cli",           # the click commands
    "__main__",      # python -m attnforge
    "attnforge",     # the package root (its lazy public API reaches dispatch)
)

#: Known upward arrows, each with the change that removes it. Delete an entry when its arrow is gone.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}

#: Names of the root package that any layer may import: plain constants defined in attnforge/__init__.py.
ROOT_CONSTANTS = frozenset({"__version__"})


def _unit(parts: tuple[str, ...]) -> str:
    """The top-level unit of a dotted module path under attnforge (``("attnforge", "probe", "x")`` -> probe)."""
    return parts[1] if len(parts) > 1 else "attnforge"


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("").parts
        pkg = rel[:-1]
        module = rel if rel[-1] != "__init__" else rel[:-1]
        here = _unit(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[tuple[str, ...]] = []
            if isinstance(node, ast.Import):
                targets = [tuple(a.name.split(".")) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = tuple(pkg[: len(pkg) - node.level + 1]) if node.level else ()
                mod = base + tuple((node.module or "").split(".")) if node.module else base
                if mod == ("attnforge",):  # from attnforge import X: X is a subpackage or a root name
                    targets = [mod if a.name in ROOT_CONSTANTS else (*mod, a.name) for a in node.names
                               if a.name not in ROOT_CONSTANTS]
                else:
                    targets = [mod]
            for t in targets:
                if t and t[0] == "attnforge" and (there := _unit(t)) != here:
                    edges[(here, there)].append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    return edges


def _units() -> set[str]:
    return {p.stem if p.is_file() else p.name for p in SRC.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")} | {
        "attnforge"}


def test_every_package_has_a_layer() -> None:
    missing = sorted(_units() - set(LAYERS))
    assert not missing, f"add {missing} to LAYERS here and to the table in docs/architecture.md"


def test_the_map_names_every_package() -> None:
    text = DOC.read_text(encoding="utf-8")
    unnamed = [u for u in sorted(_units()) if u not in ("attnforge", "__main__") and f"`{u}" not in text]
    assert not unnamed, f"docs/architecture.md does not describe {unnamed}"


def test_no_arrow_goes_up_the_layer_table() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    up = {(a, b): where for (a, b), where in _edges().items()
          if rank[a] < rank[b] and (a, b) not in KNOWN_EXCEPTIONS}
    assert not up, "imports that go up the layer table:\n" + "\n".join(
        f"  {a} -> {b}: {', '.join(w[:3])}" for (a, b), w in sorted(up.items()))


def test_known_exceptions_still_exist() -> None:
    edges = _edges()
    stale = [k for k in KNOWN_EXCEPTIONS if k not in edges]
    assert not stale, f"these arrows are gone: delete them from KNOWN_EXCEPTIONS: {stale}"


def test_no_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in _edges():
        graph[a].add(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            pytest.fail("import cycle between packages: " + " -> ".join(cycle))


def test_the_checker_sees_real_arrows() -> None:
    """Guard against a checker that reads nothing: arrows known to exist are found."""
    edges = _edges()
    assert ("cli", "resolve") in edges
    assert ("probe", "_system") in edges
    assert ("resolve", "catalog") in edges


#: Modules that reach the network. ``resolve/`` decides from data (the listings ``fetch/`` assembled), so it
#: imports none of them; the one HTTP client (``fetch/http.py``) is also enforced by ruff's banned-api.
NETWORK_MODULES = frozenset({"urllib.request", "http.client", "socket", "attnforge._system.net", "attnforge.fetch"})


def test_resolve_does_no_network_io() -> None:
    found = []
    for path in sorted((SRC / "resolve").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(SRC.parent)}:{node.lineno} imports {name}" for name in names
                      if any(name == m or name.startswith(m + ".") for m in NETWORK_MODULES)]
    assert not found, "resolve/ must take listings as data (fetch/ reads the network):\n" + "\n".join(found)

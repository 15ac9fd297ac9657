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
    "provision",     # the front door: request -> plan -> obtain -> place -> verify, for every verb
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


#: The stages of getting a kernel: the command line reaches them only through ``attnforge.provision`` (issue 32).
STAGES = ("attnforge.install", "attnforge.build", "attnforge.resolve", "attnforge.cache", "attnforge.fetch",
          "attnforge.cargo")
#: Value types and events a verb renders (no stage runs through them).
VALUES = frozenset({"attnforge.resolve.types", "attnforge.build.progress",
                    "attnforge.fetch.deadline"})  # the command's network deadline, opened once by cli.main
#: Verbs not yet moved onto the pipeline, each with what it still imports; shrink it, never grow it (empty since
#: session 8: keep it so).
NOT_YET_THROUGH_PROVISION: dict[str, frozenset[str]] = {}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_verbs_reach_the_stages_only_through_provision() -> None:
    """``plan``, ``build``, ``install`` (and every verb not listed as not yet moved) import no stage module
    (install/, build/, resolve/, cache/, fetch/) but their value types: a verb is parse -> one provision call ->
    render, so two verbs cannot assemble or execute a request two ways."""
    bad = {}
    for path in sorted((SRC / "cli").glob("*.py")):
        rel = str(path.relative_to(SRC))
        stages = {m for m in _imports(path) if m.startswith(STAGES) and m not in VALUES}
        allowed = NOT_YET_THROUGH_PROVISION.get(rel, frozenset())
        if stages - allowed:
            bad[rel] = sorted(stages - allowed)
    assert not bad, f"verbs that reach a stage around attnforge.provision: {bad}"
    for verb in ("plan", "build", "install"):
        assert "attnforge.provision" in {m[:19] for m in _imports(SRC / "cli" / f"{verb}.py")}


#: What the fleet library imports of the stages besides their value types, each with why; it obtains (builds) and
#: places (publishes) kernels only through ``attnforge.provision``, as the verbs do, its Ray tasks included.
FLEET_ALSO: dict[str, str] = {
    "attnforge.resolve": "the fleet plans every machine kind with the resolver's pure functions (no I/O)",
    "attnforge.cache.key": "the key types it plans and publishes under (values)",
    "attnforge.fetch.http": "its index server is asked and uploaded to through the one HTTP client",
}


def test_the_fleet_obtains_and_places_kernels_only_through_provision() -> None:
    """``fleet/`` (the head and its Ray tasks on the nodes) imports no stage module but value types and
    :data:`FLEET_ALSO`: a build on a node is ``provision.build.build_here``, a publish to a directory index is
    ``provision.cache.publish_to_directory``, a request is assembled by ``provision.plan.assemble``."""
    bad = {}
    for path in sorted((SRC / "fleet").rglob("*.py")):
        rel = str(path.relative_to(SRC))
        stages = {m for m in _imports(path) if m.startswith(STAGES) and m not in VALUES
                  and not m.startswith(tuple(FLEET_ALSO))}
        if stages:
            bad[rel] = sorted(stages)
    assert not bad, f"fleet modules that reach a stage around attnforge.provision: {bad}"
    for module in ("builder", "index", "requests"):
        assert any(m.startswith("attnforge.provision") for m in _imports(SRC / "fleet" / f"{module}.py"))


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of the same top-level package it imports (any import: module level, in a function,
    under ``TYPE_CHECKING``), by dotted name (``attnforge.install.flow``)."""
    names = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("").parts
        names[".".join(rel if rel[-1] != "__init__" else rel[:-1])] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
                mod = ".".join([*base, *([node.module] if node.module else [])])
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
        unit = name.split(".")[:2]
        graph[name] = {m for m in found if m in names and m != name and m.split(".")[:2] == unit
                       and m.count(".") >= 2 and name.count(".") >= 2}  # modules, not the package's __init__
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


#: In-package cycles tolerated for now, each with the import whose move removes it (none since session 8: keep it so).
KNOWN_CYCLES: dict[str, str] = {}


def test_no_import_cycle_inside_a_package() -> None:
    """Module-level cycles inside one package (``a`` imports ``b`` imports ``a``), counted as the package test counts
    imports: a reader can then read each package bottom-up."""
    found = {".".join(c[0].split(".")[:2]): c for c in _cycles(_module_graph())}
    new = {pkg: c for pkg, c in found.items() if pkg not in KNOWN_CYCLES}
    assert not new, "import cycles inside a package:\n" + "\n".join(f"  {' <-> '.join(c)}" for c in new.values())
    gone = sorted(set(KNOWN_CYCLES) - set(found))
    assert not gone, f"these cycles are gone: delete them from KNOWN_CYCLES: {gone}"


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({"a.b.c": {"a.b.d"}, "a.b.d": {"a.b.c"}, "a.b.e": set()}) == [["a.b.c", "a.b.d"]]


def test_the_map_names_every_module() -> None:
    """docs/architecture.md names every module of src/attnforge (as `name.py` in its package's section)."""
    text = DOC.read_text(encoding="utf-8")
    unnamed = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if p.name != "__init__.py" and f"`{p.name}`" not in text and f"`{p.stem}" not in text)
    assert not unnamed, f"docs/architecture.md does not map {len(unnamed)} modules: {unnamed}"


#: Scripts that still borrow test helpers (tests/cache/wheelmaker.py, tests/cache/conftest.py's inputs_for,
#: tests/install/fixture_build.py); they move to a helper module both import. Shrink it, never grow it.
SCRIPTS_ON_TEST_HELPERS = frozenset({"bench_cache_hit.py", "bench_cache_install.py", "reliability/common.py"})


def test_scripts_import_nothing_from_tests() -> None:
    scripts = SRC.parent.parent / "scripts"
    borrowing = {str(p.relative_to(scripts)) for p in scripts.rglob("*.py")
                 if any(m == "tests" or m.startswith("tests.") for m in _imports(p))}
    new, gone = sorted(borrowing - SCRIPTS_ON_TEST_HELPERS), sorted(SCRIPTS_ON_TEST_HELPERS - borrowing)
    assert not new, f"scripts that import from tests/ (move what they need into scripts/ or src/): {new}"
    assert not gone, f"these scripts import nothing from tests/ now: delete them from the list: {gone}"

"""Windows failure signatures (catalog/data/failures_windows.toml) against excerpts of real Windows logs.

The logs under tests/fixtures/logs/windows/ are excerpts of publicly reported Windows failures (paths
shortened); none was captured by attnforge on Windows. The file is checked here with a small strict reader of
the shared signature format, so these tests do not depend on the diagnose package; once
``attnforge.catalog.failures`` is present the packaged loader must accept the file too.
"""

from __future__ import annotations

import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._fakes import FIXTURES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).resolve().parents[2] / "src/attnforge/catalog/data/failures_windows.toml"
LOGS = FIXTURES / "logs" / "windows"
STAGES = {"fetch", "metadata", "compile", "link", "import", "runtime"}
FACTS = {"name", "python", "log", "torch_version", "torch_cuda", "nvcc_version", "cuda_index_tag"}
FIELDS = {"title", "stage", "patterns", "context", "when", "priority", "cause", "fix", "sources"}


@dataclass(frozen=True)
class Sig:
    id: str
    patterns: tuple[re.Pattern[str], ...]
    priority: int
    cause: str
    fix: tuple[str, ...]


def _load() -> list[Sig]:
    doc: dict[str, Any] = tomllib.loads(DATA.read_text(encoding="utf-8"))
    assert doc["schema_version"] == 1
    assert set(doc) == {"schema_version", "signatures"}
    out = []
    for sid, raw in doc["signatures"].items():
        assert sid.startswith("win-"), sid
        assert set(raw) <= FIELDS, (sid, set(raw) - FIELDS)
        assert raw["stage"] in STAGES, sid
        assert raw["sources"], sid
        assert isinstance(raw["fix"], list), sid
        assert raw["fix"], sid
        patterns = tuple(re.compile(p) for p in raw["patterns"])
        groups = {g for p in patterns for g in p.groupindex}
        for text in [raw["cause"], *raw["fix"]]:
            names = {f for _, f, _, _ in string.Formatter().parse(text) if f}
            assert names <= groups | FACTS, (sid, names - groups - FACTS)
        out.append(Sig(id=sid, patterns=patterns, priority=raw.get("priority", 0), cause=raw["cause"],
                       fix=tuple(raw["fix"])))
    return out


SIGNATURES = _load()


def best(log: str) -> tuple[Sig, dict[str, str]] | None:
    """The highest-priority signature with a pattern matching one line of the log, and its groups."""
    hits = []
    for line in log.splitlines():
        for sig in SIGNATURES:
            for pat in sig.patterns:
                m = pat.search(line)
                if m:
                    groups = {k: v for k, v in m.groupdict().items() if v is not None}
                    hits.append((sig.priority, sig, groups))
    if not hits:
        return None
    top = max(hits, key=lambda h: h[0])
    return top[1], top[2]


def _log(name: str) -> str:
    return (LOGS / name).read_bytes().decode("utf-8")


@pytest.mark.parametrize(("log", "sid", "groups"), [
    pytest.param("msvc17.10_cuda12.3_host_config.log", "win-msvc-too-new-for-nvcc",
                 {"line": "153", "first": "2017", "last": "2022"}, id="unsupported-vs"),
    pytest.param("msvc17.14_cuda12.3_stl1002.log", "win-msvc-stl-rejects-cuda", {"cuda_min": "12.4"},
                 id="stl1002"),
    pytest.param("dll_module_not_found_cu130_wheel_on_cu128_torch.log", "win-dll-module-not-found",
                 {"module": "_fused"}, id="dll-module-not-found"),
    pytest.param("dll_procedure_not_found_flash_attn.log", "win-dll-procedure-not-found",
                 {"module": "flash_attn_2_cuda"}, id="dll-procedure-not-found"),
    pytest.param("dll_init_failed_sage_fused.log", "win-dll-init-failed", {"module": "_fused"},
                 id="dll-init-failed"),
    pytest.param("libtriton_vcredist.log", "win-libtriton-vcredist", {}, id="libtriton-vcredist"),
    pytest.param("path_too_long_c1083.log", "win-path-too-long-cl", {}, id="path-too-long"),
    pytest.param("std_ambiguous_c2872.log", "win-std-ambiguous", {}, id="conformance-c2872"),
    pytest.param("python_h_embedded.log", "win-python-h-missing", {}, id="embedded-python-h"),
    pytest.param("lnk1104_python312.log", "win-python-lib-missing", {"lib": "python312.lib"},
                 id="embedded-lib"),
])
def test_windows_log_gets_its_signature(log: str, sid: str, groups: dict[str, str]) -> None:
    found = best(_log(log))
    assert found is not None
    sig, got = found
    assert sig.id == sid
    assert {k: got[k] for k in groups} == groups


def test_path_too_long_names_the_path_and_the_short_root() -> None:
    found = best(_log("path_too_long_c1083.log"))
    assert found is not None
    sig, groups = found
    assert len(groups["path"]) > 260
    assert any("C:\\afb" in f for f in sig.fix)


def test_a_short_missing_file_is_not_called_a_long_path() -> None:
    line = "c1xx: fatal error C1083: Cannot open source file: 'C:\\b\\x.cpp': No such file or directory"
    assert best(line) is None


@pytest.mark.parametrize("sid", ["win-msvc-too-new-for-nvcc", "win-msvc-stl-rejects-cuda"])
def test_msvc_fixes_name_every_real_way_out(sid: str) -> None:
    sig = next(s for s in SIGNATURES if s.id == sid)
    text = " ".join(sig.fix)
    assert "-vcvars_ver=14.39" in text
    assert "-allow-unsupported-compiler" in text
    assert "CUDA" in text


def test_stl1002_says_the_override_flag_does_not_help_alone() -> None:
    sig = next(s for s in SIGNATURES if s.id == "win-msvc-stl-rejects-cuda")
    assert "does not silence" in sig.cause
    assert any("-D_ALLOW_COMPILER_AND_STL_VERSION_MISMATCH" in f for f in sig.fix)


def test_generic_logs_are_left_to_the_generic_signatures() -> None:
    """cl.exe missing and DISTUTILS_USE_SDK are covered once, in failures.toml (missing-cl,
    distutils-use-sdk)."""
    assert best(_log("cl_not_found.log")) is None
    assert best(_log("distutils_use_sdk.log")) is None


def test_ids_are_unique_and_patterns_are_distinct() -> None:
    ids = [s.id for s in SIGNATURES]
    assert len(ids) == len(set(ids))
    pats = [p.pattern for s in SIGNATURES for p in s.patterns]
    assert len(pats) == len(set(pats))


def test_the_packaged_loader_accepts_the_windows_file() -> None:
    failures = pytest.importorskip("attnforge.catalog.failures", reason="the loader is on branch build")
    catalog = failures.load_failures()
    ours = [s for s in catalog.signatures if s.origin == "failures_windows.toml"]
    assert {s.id for s in ours} == {s.id for s in SIGNATURES}
    generic = {s.id: s for s in catalog.signatures if s.origin == "failures.toml"}
    for gid in ("missing-cl", "distutils-use-sdk"):
        sig = generic.get(gid)
        if sig is not None:  # the generic entries this file relies on
            log = _log("cl_not_found.log" if gid == "missing-cl" else "distutils_use_sdk.log")
            assert any(p.search(line) for p in sig.patterns for line in log.splitlines())
    for name in ("msvc17.10_cuda12.3_host_config.log", "dll_init_failed_sage_fused.log"):
        log = _log(name)
        lines = log.splitlines()
        matching = [s for s in catalog.signatures if any(p.search(ln) for p in s.patterns for ln in lines)]
        assert max(matching, key=lambda s: s.priority).origin == "failures_windows.toml", name

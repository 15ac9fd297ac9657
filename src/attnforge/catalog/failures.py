"""Failure signatures: how a build or import log says what went wrong, and what to do about it.

The knowledge lives in ``catalog/data/failures*.toml`` (``failures.toml`` for everything, and e.g.
``failures_windows.toml`` for Windows-only entries), one table per signature with its sources. This module
only reads and checks them; :mod:`attnforge.diagnose` applies them to a log.

A signature's ``cause`` and ``fix`` may use ``{placeholders}``: the named groups of its own patterns, or the
facts in :data:`FACTS` (filled from the snapshot and the build when known, shown as ``<name>`` otherwise).
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge._compat import StrEnum
from attnforge.catalog._check import DATA_DIR, Collector, Sourced, read_checked

STAGES = ("fetch", "metadata", "compile", "link", "import", "runtime")
#: Facts a cause or fix may name besides its patterns' groups.
FACTS = ("name", "python", "log", "torch_version", "torch_cuda", "nvcc_version", "cuda_index_tag", "cuda_home",
         "host_compiler", "arch_reason", "arch_fix")
_FIELDS = {"title", "stage", "patterns", "context", "when", "priority", "cause", "fix", "sources"}


class Condition(StrEnum):
    """Facts about the machine a signature can require (read from the snapshot; unknown means not met)."""

    TORCH_CPU = "torch-cpu"  # torch is installed and is a CPU-only build
    TORCH_CUDA = "torch-cuda"  # torch is a CUDA build
    NO_CUDA_TOOLKIT = "no-cuda-toolkit"  # no nvcc was found
    CUDA_MAJOR_MISMATCH = "cuda-major-mismatch"  # torch's CUDA major differs from the toolkit's
    NO_NINJA = "no-ninja"
    WINDOWS = "windows"
    LINUX = "linux"


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureSignature(Sourced):
    """One known failure.

    Attributes:
        id: the table name (``out-of-memory``).
        title: a short name for people.
        stage: where it shows up, one of :data:`STAGES`.
        patterns: regexes, any of which identifies the failure on one log line.
        context: regexes of which at least one must occur somewhere in the log (empty: no requirement).
        when: machine facts that must all hold (a signature with conditions needs a snapshot).
        priority: the higher wins when several signatures match the same part of the log.
        cause: one sentence, may use placeholders.
        fix: commands or steps, may use placeholders.
        sources: where the knowledge comes from (issues, files, research notes).
        origin: the data file it came from.
    """

    id: str
    title: str
    stage: str
    patterns: tuple[re.Pattern[str], ...]
    context: tuple[re.Pattern[str], ...]
    when: tuple[Condition, ...]
    priority: int
    cause: str
    fix: tuple[str, ...]
    origin: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureCatalog:
    """Every signature from every ``failures*.toml``, in file order (``failures.toml`` first)."""

    signatures: tuple[FailureSignature, ...]

    def get(self, signature_id: str) -> FailureSignature | None:
        return next((s for s in self.signatures if s.id == signature_id), None)


def load_failures(data_dir: Path | None = None) -> FailureCatalog:
    """Load and check every ``failures*.toml`` in ``data_dir`` (the packaged data when None).

    Raises:
        CatalogError: a file is unreadable or has bad fields; ``problems`` lists every dotted path.
    """
    if data_dir is None:
        return _packaged()
    return _load(data_dir)


@functools.cache
def _packaged() -> FailureCatalog:  # several files (failures*.toml) with cross-file id checks: cached here
    return _load(DATA_DIR)


def _load(data_dir: Path) -> FailureCatalog:
    files = sorted(data_dir.glob("failures*.toml"), key=lambda p: (p.name != "failures.toml", p.name))
    signatures: list[FailureSignature] = []
    seen: dict[str, str] = {}
    for path in files:
        doc, errors = read_checked(path, {"signatures"})
        for sig in parse_signatures(doc, errors, origin=path.name):
            if sig.id in seen:
                errors.add(f"signatures.{sig.id}", f"already defined in {seen[sig.id]}")
                continue
            seen[sig.id] = path.name
            signatures.append(sig)
        errors.finish()
    return FailureCatalog(signatures=tuple(signatures))


def parse_signatures(doc: Mapping[str, Any], errors: Collector, *, origin: str) -> list[FailureSignature]:
    """Read the ``[signatures.*]`` tables, recording every bad field in ``errors``."""
    out: list[FailureSignature] = []
    for sid, raw, path in errors.rows(doc, "signatures", _FIELDS):
        stage = errors.get(raw, "stage", path, str)
        if stage and stage not in STAGES:
            errors.add(f"{path}.stage", f"expected one of {STAGES}, got {stage!r}")
        patterns = _regexes(errors.str_list(raw, "patterns", path, allow_empty=False), f"{path}.patterns",
                            errors)
        context = _regexes(errors.str_list(raw, "context", path) if "context" in raw else (),
                           f"{path}.context", errors)
        when: list[Condition] = []
        for i, text in enumerate(errors.str_list(raw, "when", path) if "when" in raw else ()):
            try:
                when.append(Condition(text))
            except ValueError:
                known = [c.value for c in Condition]
                errors.add(f"{path}.when[{i}]", f"unknown condition {text!r}; known: {known}")
        groups = {name for p in patterns for name in p.groupindex}
        cause = errors.get(raw, "cause", path, str)
        fix = errors.str_list(raw, "fix", path)
        _check_placeholders(cause, f"{path}.cause", groups, errors)
        for i, step in enumerate(fix):
            _check_placeholders(step, f"{path}.fix[{i}]", groups, errors)
        out.append(FailureSignature(
            id=sid,
            title=errors.get(raw, "title", path, str),
            stage=stage,
            patterns=tuple(patterns),
            context=tuple(context),
            when=tuple(when),
            priority=errors.get(raw, "priority", path, int, default=0),
            cause=cause,
            fix=fix,
            sources=errors.sources(raw, path),
            origin=origin,
        ))
    return out


def _regexes(texts: tuple[str, ...], path: str, errors: Collector) -> list[re.Pattern[str]]:
    out: list[re.Pattern[str]] = []
    for i, text in enumerate(texts):
        try:
            out.append(re.compile(text))
        except re.error as exc:
            errors.add(f"{path}[{i}]", f"not a valid regex: {exc}")
    return out


def _check_placeholders(text: str, path: str, groups: set[str], errors: Collector) -> None:
    try:
        names = {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
    except ValueError as exc:
        errors.add(path, f"bad placeholder syntax: {exc}")
        return
    for name in sorted(names - groups - set(FACTS)):
        errors.add(path, f"unknown placeholder {{{name}}}; use a pattern group or one of {FACTS}")

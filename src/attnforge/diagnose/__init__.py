"""Cause and fix for a failed build or import log.

:func:`diagnose_text` finds the real failure (:mod:`attnforge.diagnose.extract`), matches it against the
failure signatures in ``catalog/data/failures*.toml``, and says in one sentence what went wrong, which log
lines show it, and which commands fix it. The snapshot, when given, sharpens the answer: "CUDA_HOME is not
set" from a CPU-only torch is a torch problem, not a toolkit problem. A log that matches nothing is reported
as unknown, with the excerpt that looked most like the failure.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from attnforge.catalog.failures import Condition, FailureCatalog, FailureSignature, load_failures
from attnforge.diagnose.extract import FailureSite, LogLine, find_failure
from attnforge.diagnose.logfacts import MAX_LINE_CHARS, LogFacts, clipped, full_module, log_facts, printable
from attnforge.errors import UsageError
from attnforge.probe.snapshot import SystemSnapshot

_SUCCESS = re.compile(r"^[ \t]*(?:Successfully built |attnforge: built )", re.MULTILINE)  # \s would span lines
_CONTEXT_LINES = 2
_EXCERPT_LINES = 20
_ERRORISH = re.compile(r"\berror\b|fatal|killed|not found|exhausted|no module named", re.IGNORECASE)
_SOURCE_EXT = r"\.(?:cu|cuh|cpp|cc|cxx|c|h|hpp|hxx|inl)"
# A Windows path keeps its drive letter and its spaces ("C:\Program Files\..."); any other file name starts where
# a token starts (the look-behind), so a long run of path characters is scanned once, not once per character.
_LOCATION = re.compile(
    rf"(?P<file>[A-Za-z]:[\\/][^:()\n\"'<>|*?]{{0,4096}}?{_SOURCE_EXT}|(?<![^\s:()])[^\s:()]{{1,4096}}{_SOURCE_EXT})"
    r"(?::(?P<line>\d+)(?::\d+)?:|\((?P<line2>\d+)\):)\s+(?:fatal )?error"
)

#: How a placeholder reads when nothing (snapshot, probe, log) gave its value.
_UNKNOWN = {
    "nvcc_version": "<this machine's nvcc version>",
    "torch_cuda": "<your torch's CUDA version>",
    "torch_version": "<your torch version>",
    "cuda_index_tag": "<cuXYZ tag of your CUDA, e.g. cu128>",
    "cuda_home": "<the CUDA toolkit's folder>",
    "host_compiler": "<the host compiler>",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    """What a log says went wrong.

    Attributes:
        known: a signature matched; False means "attnforge does not recognise this" and ``evidence`` is the
            excerpt that looked most like the failure.
        signature: the matched signature's id (``out-of-memory``), None when unknown.
        title: a short name for the failure.
        stage: where it happened (``metadata``, ``compile``, ``import``, ...), None when unknown.
        cause: one sentence.
        fix: commands (or steps) in order.
        evidence: the lines that matter, with their line numbers in the log.
        location: ``file:line`` of the compiler error in the *source*, when the log names one.
        failed_target: what ninja failed to build, when it got that far.
        log_path: the log the evidence line numbers refer to.
        sources: where the knowledge behind the answer comes from.
        notes: what the answer rests on besides the log (values from this machine's probe, dropped bytes).
    """

    known: bool
    signature: str | None
    title: str
    stage: str | None
    cause: str
    fix: tuple[str, ...]
    evidence: tuple[LogLine, ...]
    location: str | None
    failed_target: str | None
    log_path: str | None
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


#: the most of a log :func:`diagnose_file` reads: a verbose FlashAttention build writes tens of MB, and the first
#: ``FAILED:`` block it looks for comes early; ``diagnose /dev/zero`` read without end (CLI fuzz, 2026-12-03)
MAX_LOG_READ_BYTES = 256 << 20


def diagnose_file(
    path: Path, *, snapshot: SystemSnapshot | object | None = None, name: str | None = None,
    failures: FailureCatalog | None = None, machine: SystemSnapshot | None = None,
) -> Diagnosis:
    """Diagnose the log at ``path`` (see :func:`diagnose_text`); only its printable text is used.

    Raises:
        UsageError: the file cannot be read.
    """
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_LOG_READ_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read the log {path}", cause=exc.strerror,
                         hint="give the path of a build log, e.g. one under $ATTNFORGE_HOME/logs") from None
    cut = len(data) > MAX_LOG_READ_BYTES
    raw = data[:MAX_LOG_READ_BYTES].decode("utf-8", errors="replace")
    text, dropped = printable(raw.replace("\ufffd", ""))
    found = diagnose_text(text, snapshot=snapshot, log_path=str(path), name=name, failures=failures,
                          machine=machine)
    if cut:
        found = dataclasses.replace(found, notes=(*found.notes, f"only the first {MAX_LOG_READ_BYTES >> 20} MiB of "
                                                                "the log were read"))
    if dropped or "\ufffd" in raw:
        note = f"{dropped + raw.count(chr(0xFFFD))} unprintable characters of the log were left out"
        found = dataclasses.replace(found, notes=(*found.notes, note))
    return found


def diagnose_text(
    text: str, *, snapshot: SystemSnapshot | object | None = None, log_path: str | None = None,
    name: str | None = None, failures: FailureCatalog | None = None, machine: SystemSnapshot | None = None,
) -> Diagnosis:
    """Find and explain the failure in a build or import log.

    Signatures are tried first on the first ``FAILED:`` block (the compiler's words), then on the rest of the
    log without wrapper lines. Among the signatures that match one region, the highest ``priority`` wins, then
    the earliest line. Signatures with ``when`` conditions apply only when the snapshot shows them. A line longer
    than :data:`~attnforge.diagnose.logfacts.MAX_LINE_CHARS` is read as its first and last half of that (the
    notes say so); an empty log is "no failure" ("the log is empty: nothing to diagnose").

    Args:
        text: the log.
        snapshot: the machine the log came from (a :class:`SystemSnapshot`), optional.
        log_path: shown in the fix commands and the evidence.
        name: the package being built, used in fix commands (else the one the log names, else ``<package>``).
        failures: the signatures (the packaged ones when None).
        machine: this machine's probe, used only to fill placeholders (nvcc and torch versions) when there is
            no ``snapshot``; the answer's notes say so. Facts the log states (a ``+cpu`` torch) count too, and
            rank a root cause over its symptom.

    Raises:
        CatalogError: the packaged signatures are malformed.
    """
    if not text.strip():
        return Diagnosis(
            known=False, signature=None, title="no failure", stage=None,
            cause="the log is empty: nothing to diagnose", fix=(), evidence=(), location=None,
            failed_target=None, log_path=log_path,
        )
    text, cut = clipped(text)
    found = _diagnose(text, snapshot=snapshot, log_path=log_path, name=name, failures=failures, machine=machine)
    if cut:
        note = (f"{cut} line(s) longer than {MAX_LINE_CHARS // 1024} KiB were read as their first and last "
                f"{MAX_LINE_CHARS // 2048} KiB")
        found = dataclasses.replace(found, notes=(*found.notes, note))
    return found


def _diagnose(
    text: str, *, snapshot: SystemSnapshot | object | None, log_path: str | None, name: str | None,
    failures: FailureCatalog | None, machine: SystemSnapshot | None,
) -> Diagnosis:
    catalog = failures or load_failures()
    snap = snapshot if isinstance(snapshot, SystemSnapshot) else None
    site = find_failure(text)
    said = log_facts(text)
    applicable = [s for s in catalog.signatures if _conditions_hold(s, snap, said) and _context_holds(s, text)]
    for region in (site.block, site.rest):
        found = _best_match(applicable, region)
        if found is not None:
            sig, line, match = found
            values, notes = _values(snap, machine, said, name=name, log_path=log_path)
            return _known(sig, line, match, region, site=site, values=values, text=text, log_path=log_path,
                          notes=notes)
    if not site.block and _SUCCESS.search(text):
        return Diagnosis(
            known=False, signature=None, title="no failure", stage=None,
            cause="this log ends in a successful build: there is no failure to explain", fix=(),
            evidence=(), location=None, failed_target=None, log_path=log_path,
        )
    return _unknown(site, log_path)


def _best_match(
    signatures: list[FailureSignature], region: tuple[LogLine, ...]
) -> tuple[FailureSignature, LogLine, re.Match[str]] | None:
    best: tuple[FailureSignature, LogLine, re.Match[str]] | None = None
    for sig in signatures:
        hit = _first_hit(sig, region)
        if hit is None:
            continue
        line, match = hit
        if best is None or (sig.priority, -line.line) > (best[0].priority, -best[1].line):
            best = (sig, line, match)
    return best


def _first_hit(sig: FailureSignature, region: tuple[LogLine, ...]) -> tuple[LogLine, re.Match[str]] | None:
    for line in region:
        for pattern in sig.patterns:
            m = pattern.search(line.text)
            if m is not None:
                return line, m
    return None


def _context_holds(sig: FailureSignature, text: str) -> bool:
    return not sig.context or any(p.search(text) for p in sig.context)


def _conditions_hold(sig: FailureSignature, snap: SystemSnapshot | None, said: LogFacts) -> bool:
    """Every ``when`` of ``sig`` holds: torch facts the log states first, then the snapshot's."""
    if not sig.when:
        return True
    return all(_said(c, said) if _said(c, said) is not None else snap is not None and _condition(c, snap)
               for c in sig.when)


def _said(cond: Condition, said: LogFacts) -> bool | None:
    """What the log itself says about a torch condition (None: the log does not say)."""
    if said.torch_version is None or cond not in (Condition.TORCH_CPU, Condition.TORCH_CUDA):
        return None
    return said.torch_cpu if cond is Condition.TORCH_CPU else said.torch_cuda is not None


def _values(snap: SystemSnapshot | None, machine: SystemSnapshot | None, said: LogFacts, *, name: str | None,
            log_path: str | None) -> tuple[_Values, tuple[str, ...]]:
    """Placeholder values: the snapshot's, else this machine's probe; the torch and package the log names win."""
    source = snap or machine
    values = _Values(facts(source, name=name or said.package, log_path=log_path))
    notes: list[str] = []
    from_log = [f"nvcc {said.nvcc_version}" if said.nvcc_version else "", said.host_compiler or "",
                f"CUDA_HOME {said.cuda_home}" if said.cuda_home else ""]
    if said.nvcc_version:  # the toolkit that really ran (a CUDA_HOME or PATH of its own), before any snapshot's
        values["nvcc_version"] = said.nvcc_version
    if said.cuda_home:
        values["cuda_home"] = said.cuda_home
    if said.host_compiler:
        values["host_compiler"] = said.host_compiler
    if snap is not None and any(from_log):
        notes.append(f"the log's own toolchain ({', '.join(f for f in from_log if f)}) is used before the snapshot's")
    if said.torch_version:  # the torch the build ran against, which may not be the snapshot's (build isolation)
        values["torch_version"] = said.torch_version
        values.pop("torch_cuda", None)
        if said.torch_cuda:
            values["torch_cuda"] = said.torch_cuda
            values["cuda_index_tag"] = "cu" + said.torch_cuda.replace(".", "")
    if snap is None and machine is not None:
        probed = [k for k in ("torch_version", "nvcc_version")
                  if k in values and not (k == "nvcc_version" and said.nvcc_version)
                  and not (k == "torch_version" and said.torch_version)]
        known = ", ".join(f"{k} {values[k]}" for k in probed)
        if any(from_log):
            notes.append(f"from the log itself: {', '.join(f for f in from_log if f)}")
            if not known:
                return values, tuple(notes)
        notes.append(f"values not in the log come from this machine's probe ({known or 'no torch, no nvcc'}); "
                     "pass --snapshot FILE for the machine the log came from")
    return values, tuple(notes)


def _condition(cond: Condition, snap: SystemSnapshot) -> bool:
    torch = snap.torch
    toolkit = snap.primary_toolkit
    if cond is Condition.TORCH_CPU:
        return torch is not None and torch.cuda_version is None and torch.hip_version is None
    if cond is Condition.TORCH_CUDA:
        return torch is not None and torch.cuda_version is not None
    if cond is Condition.NO_CUDA_TOOLKIT:
        return toolkit is None
    if cond is Condition.CUDA_MAJOR_MISMATCH:
        return (torch is not None and torch.cuda_version is not None and toolkit is not None
                and torch.cuda_version.split(".")[0] != toolkit.version.split(".")[0])
    if cond is Condition.NO_NINJA:
        return snap.ninja is None
    if cond is Condition.WINDOWS:
        return snap.platform.os == "windows"
    return snap.platform.os == "linux"


def facts(snap: SystemSnapshot | None, *, name: str | None, log_path: str | None) -> dict[str, str]:
    """The values of the placeholders a signature may use besides its own groups."""
    out = {"name": name or "<package>", "log": log_path or "<log>", "python": "python"}
    if snap is None:
        return out
    out["python"] = snap.platform.python_executable or "python"
    toolkit = snap.primary_toolkit
    if snap.torch is not None:
        out["torch_version"] = snap.torch.version
        if snap.torch.cuda_version:
            out["torch_cuda"] = snap.torch.cuda_version
    if toolkit is not None:
        out["nvcc_version"] = toolkit.version
    cuda = (snap.torch.cuda_version if snap.torch and snap.torch.cuda_version else None) or (
        toolkit.version if toolkit else None)
    if cuda:
        out["cuda_index_tag"] = "cu" + cuda.replace(".", "")[:3]
    return out


class _Values(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return _UNKNOWN.get(key, f"<{key}>")


def _fill(template: str, values: _Values) -> str:
    return template.format_map(values)


def _known(
    sig: FailureSignature, line: LogLine, match: re.Match[str], region: tuple[LogLine, ...], *,
    site: FailureSite, values: _Values, text: str, log_path: str | None, notes: tuple[str, ...],
) -> Diagnosis:
    values.update({k: v.strip() for k, v in match.groupdict().items() if v})
    for other in region:  # groups another line of the same failure fills (xFormers' "built for" block)
        for pattern in sig.patterns:
            m = pattern.search(other.text)
            if m is not None:
                for key, value in m.groupdict().items():
                    if value and key not in values:
                        values[key] = value.strip()
    if "module" in values:
        values["module"] = full_module(values["module"], text)
    if "arch" in values:
        values.update(arch_facts(values["arch"], values.get("nvcc_version"), name=values["name"]))
    at = region.index(line)
    shown = region[max(0, at - _CONTEXT_LINES) : at + _CONTEXT_LINES + 1]
    return Diagnosis(
        known=True, signature=sig.id, title=sig.title, stage=sig.stage, cause=_fill(sig.cause, values),
        fix=tuple(_fill(step, values) for step in sig.fix),
        evidence=tuple(LogLine(line=ln.line, text=ln.text.strip()) for ln in shown),
        location=_location(region, match), failed_target=site.target, log_path=log_path, sources=sig.sources,
        notes=notes,
    )


def arch_facts(arch: str, nvcc_version: str | None, *, name: str) -> dict[str, str]:
    """``arch_reason`` and ``arch_fix`` for an nvcc that refused ``arch``, from the toolchain table
    (``catalog/data/toolchain.toml``, which nvcc releases emit which target): an nvcc too old for it
    (``compute_120`` needs CUDA >= 12.8), one that dropped it, or a name that is no architecture at all."""
    from attnforge.catalog import load_catalog
    from attnforge.catalog.toolchain import Target
    from attnforge.types.versions import format_major_minor, parse_major_minor

    guess = f"attnforge build {name} --arch 9.0   # one this nvcc can target: the compute capability of your GPU"
    try:
        target = Target.parse(arch)
    except ValueError:
        target = None
    support = load_catalog().tools.target_support(target) if target is not None else None
    if target is None or support is None:
        return {"arch_reason": f"{arch} is not an architecture any nvcc knows (a CUDA version is not an arch:"
                               " 12.8 is not compute_128)", "arch_fix": guess}
    lo = format_major_minor(support.first_cuda)
    hi = format_major_minor(support.last_cuda) if support.last_cuda is not None else None
    window = f"CUDA >= {lo}" + (f" and <= {hi}" if hi else "")
    try:
        have = parse_major_minor(nvcc_version) if nvcc_version else None
    except ValueError:
        have = None
    if have is not None and have < support.first_cuda:
        return {"arch_reason": f"{arch} needs {window}, and the nvcc that ran is {nvcc_version}",
                "arch_fix": f"CUDA_HOME=/usr/local/cuda-{lo} attnforge build {name}   # a CUDA >= {lo} toolkit"
                            " installed there (or on PATH)"}
    if have is not None and support.last_cuda is not None and have > support.last_cuda:
        return {"arch_reason": f"{arch} needs {window}: CUDA {format_major_minor(have)} dropped it",
                "arch_fix": f"attnforge build {name} --arch 9.0   # without {target.cc[0]}.{target.cc[1]}, or with"
                            f" CUDA_HOME at a CUDA <= {hi} toolkit"}
    return {"arch_reason": f"{arch} needs {window}", "arch_fix": guess}


def _location(region: tuple[LogLine, ...], match: re.Match[str]) -> str | None:
    groups = match.groupdict()
    if groups.get("file") and groups.get("line"):
        return f"{groups['file']}:{groups['line']}"
    for ln in region:
        m = _LOCATION.search(ln.text)
        if m is not None:
            return f"{m['file']}:{m['line'] or m['line2']}"
    return None


def _unknown(site: FailureSite, log_path: str | None) -> Diagnosis:
    if site.block:
        excerpt = list(site.block[:_EXCERPT_LINES])
    else:
        errorish = [ln for ln in site.rest if _ERRORISH.search(ln.text)]
        excerpt = errorish[:_EXCERPT_LINES] or list(site.rest[-_EXCERPT_LINES:])
    where = f" (ninja failed to build {site.target})" if site.target else ""
    return Diagnosis(
        known=False, signature=None, title="unrecognised failure", stage=None,
        cause=f"attnforge does not recognise this failure{where}; the lines below are the likeliest cause",
        fix=(f"read the full log: {log_path}" if log_path else "read the full log",),
        evidence=tuple(LogLine(line=ln.line, text=ln.text.strip()) for ln in excerpt),
        location=None, failed_target=site.target, log_path=log_path,
    )


__all__ = ["Diagnosis", "LogLine", "diagnose_file", "diagnose_text", "facts"]

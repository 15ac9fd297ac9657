"""Build recipes and wheel filename grammars (``catalog/data/backends.toml``, tables
``recipes`` and ``wheel_grammars``).

A recipe says how a backend is compiled: which variable carries the arch list and in what format
(``FLASH_ATTN_CUDA_ARCHS="90;120"`` versus ``TORCH_CUDA_ARCH_LIST="9.0;12.0"``), which nvcc targets it can
emit and what nvcc each needs. A wheel grammar says how a publisher spells torch/CUDA/C++11 ABI in the PEP 440
local version label (``2.8.3+cu12torch2.8cxx11abiTRUE``). Sources: docs/research/install-anchors.md §1-§7.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnforge._compat import StrEnum
from attnforge.catalog._check import Collector
from attnforge.catalog.slim import SlimSwitches, parse_slim
from attnforge.catalog.toolchain import MajorMinor, Target, format_major_minor, parse_major_minor
from attnforge.types.cc import ComputeCapability


class RecipeKind(StrEnum):
    BUILD = "build"  # compile a torch CUDA extension from source
    PIP = "pip"  # a pure-Python wheel from the package index: nothing to compile


class ArchFormat(StrEnum):
    DIGITS = "digits"  # "90;120" (FLASH_ATTN_CUDA_ARCHS)
    DOTTED = "dotted"  # "9.0;12.0" (TORCH_CUDA_ARCH_LIST)


class TorchMatch(StrEnum):
    MAJOR_MINOR = "major-minor"  # the wheel's torch M.m must equal the installed one
    EXACT = "exact"  # M.m.p must be equal
    AT_LEAST = "at-least"  # libtorch stable ABI: any torch >= the wheel's
    NONE = "none"  # the label does not say (pinned through Requires-Dist)


#: The recipe used for a name the catalog does not know (``attnforge build NAME --source PATH``).
GENERIC_RECIPE = "torch-extension"
#: The same for a local source with C++ files only (``CppExtension``, ``resolve/cpu_only.py``): host-compiler floors.
CPP_RECIPE = "torch-cpp-extension"


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceEdit:
    """One text replacement made in a laid-out build tree before the build (never in the user's source): the one
    occurrence of ``find`` in ``file`` (relative to the tree that is built, i.e. below any ``#subdirectory=``)
    becomes ``replace``. A tree where ``find`` does not occur exactly once is refused (the source changed)."""

    file: str
    find: str
    replace: str
    #: what the bound build saves, as measured (its source among the table's sources); not in the digest
    gain: str = "less host time a call"

    def digest(self) -> str:
        """12 hex digits of the edit's sha256: names it in cache keys and build-tree names."""
        return hashlib.sha256("\0".join((self.file, self.find, self.replace)).encode()).hexdigest()[:12]

    def key_flag(self) -> str:
        """The edit as a cache key's build flag (``edit:setup.py:<digest>``): the bytes built are not the source's."""
        return f"edit:{self.file}:{self.digest()}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """How to build (or pip-install) one backend. See the header of ``backends.toml`` for each field."""

    id: str
    kind: RecipeKind
    distribution: str
    arch_env: str
    arch_format: ArchFormat
    targets: tuple[Target, ...]
    adds_ptx: bool
    min_nvcc: MajorMinor
    min_nvcc_targets: Mapping[str, MajorMinor]
    env: Mapping[str, str]
    nvcc_threads: int
    gb_per_nvcc_thread: int
    min_free_disk_gb: float
    source_kinds: tuple[str, ...]
    sdist: str
    git_url: str
    git_subdirectory: str
    sources: tuple[str, ...]
    submodules: tuple[str, ...] = ()
    slim: SlimSwitches | None = None
    stable_abi_from: MajorMinor | None = None  # built with torch >= this, the binary uses the libtorch stable ABI
    #                                            and needs torch >= this (a fleet plans one build for those torches)
    per_torch: SourceEdit | None = None  # with stable_abi_from: the edit that binds a build to the building torch
    per_torch_also: tuple[SourceEdit, ...] = ()  # made with it: what the bound build adds (FA3: a lean entry)
    parallel_env: str = ""  # setup.py's variable for building extension modules side by side (EXT_PARALLEL)
    extension_units: tuple[int, ...] = ()  # translation units of each extension module (parallel_env's sizing)

    def per_torch_edits(self) -> tuple[SourceEdit, ...]:
        """Every edit ``--abi torch`` makes in the laid-out tree, in order: the binding edit, then those that go with
        it (``[[recipes.ID.per_torch.also]]``); none without a binding edit."""
        return () if self.per_torch is None else (self.per_torch, *self.per_torch_also)

    def builds_stable_with(self, torch_version: str) -> bool | None:
        """Whether a build of this recipe against ``torch_version`` (``2.11.0+cu130``) uses the libtorch stable ABI
        by itself (``stable_abi_from`` <= its major.minor); None where the version cannot be read."""
        from packaging.version import InvalidVersion, Version

        if self.stable_abi_from is None:
            return False
        try:
            have = Version(torch_version.split("+", 1)[0]).release[:2]
        except InvalidVersion:
            return None
        return tuple(have) >= self.stable_abi_from

    def target_for(self, cc: ComputeCapability, runs_on: Any) -> Target | None:
        """The best target this recipe can emit whose code runs on ``cc`` (the highest one), or None.

        ``runs_on(target, cc) -> bool`` is :meth:`Toolchain.runs_on`.
        """
        fitting = [t for t in self.targets if runs_on(t, cc)]
        return max(fitting, key=lambda t: t.cc, default=None)

    def arch_value(self, targets: tuple[Target, ...]) -> str:
        """The arch variable's value: ``"90;120"`` (digits) or ``"9.0;12.0"`` (dotted), in ascending order."""
        ccs = sorted({t.cc for t in targets})
        if self.arch_format is ArchFormat.DIGITS:
            return ";".join(f"{major}{minor}" for major, minor in ccs)
        return ";".join(f"{major}.{minor}" for major, minor in ccs)

    def min_nvcc_for(self, target: Target) -> MajorMinor:
        return max(self.min_nvcc, self.min_nvcc_targets.get(str(target), (0, 0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaTag:
    """The CUDA part of a wheel label: ``cu12`` (major only) or ``cu128`` (12.8)."""

    major: int
    minor: int | None

    @classmethod
    def parse(cls, digits: str) -> CudaTag:
        """``"12"`` -> 12, ``"128"`` -> 12.8, ``"118"`` -> 11.8, ``"130"`` -> 13.0.

        Raises:
            ValueError: not 1-3 digits.
        """
        if not digits.isdigit() or not 1 <= len(digits) <= 3:
            raise ValueError(f"not a CUDA tag: cu{digits}")
        if len(digits) <= 2:
            return cls(major=int(digits), minor=None)
        return cls(major=int(digits[:2]), minor=int(digits[2]))

    def __str__(self) -> str:
        return f"{self.major}" if self.minor is None else f"{self.major}{self.minor}"

    def text(self) -> str:
        """For people: ``12`` or ``12.8``."""
        return f"{self.major}" if self.minor is None else f"{self.major}.{self.minor}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelLabel:
    """What a local version label says about the build a wheel came from."""

    grammar: str
    cuda: CudaTag | None
    torch: str | None
    cxx11_abi: bool | None
    post: int | None = None
    commit: str | None = None


_FIELD_RE = {
    "cuda": r"(?P<cuda>\d{1,3})",
    "torch": r"(?P<torch>\d+\.\d+(?:\.\d+)?)",
    "cxx11abi": r"(?P<cxx11abi>true|false)",
    "post": r"(?P<post>\d+)",
    "commit": r"(?P<commit>[0-9a-f]+)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelGrammar:
    """One publisher's local-label grammar; :meth:`parse` and :meth:`format` round-trip."""

    id: str
    distribution: str
    label: str
    torch_match: TorchMatch
    archs: tuple[Target, ...]
    example: str
    sources: tuple[str, ...]

    def regex(self) -> re.Pattern[str]:
        parts = re.split(r"(\{[a-z0-9]+\})", self.label)
        body = "".join(_FIELD_RE[p[1:-1]] if p.startswith("{") else re.escape(p.lower()) for p in parts if p)
        return re.compile(f"^{body}$")

    def parse(self, local: str) -> WheelLabel | None:
        """Read a local label (``packaging.version.Version(v).local``, lower-case) or
        return None if it does not fit.
        """
        m = self.regex().match(local.lower())
        if m is None:
            return None
        groups = m.groupdict()
        abi = groups.get("cxx11abi")
        post = groups.get("post")
        return WheelLabel(
            grammar=self.id,
            cuda=CudaTag.parse(groups["cuda"]) if groups.get("cuda") else None,
            torch=groups.get("torch"),
            cxx11_abi=None if abi is None else abi == "true",
            post=None if post is None else int(post),
            commit=groups.get("commit"),
        )

    def format(self, label: WheelLabel) -> str:
        """Write a label the way this publisher does (``cu12torch2.8cxx11abiTRUE``)."""
        values = {
            "cuda": "" if label.cuda is None else str(label.cuda),
            "torch": label.torch or "",
            "cxx11abi": "" if label.cxx11_abi is None else str(label.cxx11_abi).upper(),
            "post": "" if label.post is None else str(label.post),
            "commit": label.commit or "",
        }
        return re.sub(r"\{([a-z0-9]+)\}", lambda m: values[m.group(1)], self.label)


_RECIPE_FIELDS = {
    "kind",
    "distribution",
    "arch_env",
    "arch_format",
    "targets",
    "adds_ptx",
    "min_nvcc",
    "min_nvcc_targets",
    "env",
    "nvcc_threads",
    "gb_per_nvcc_thread",
    "min_free_disk_gb",
    "source_kinds",
    "sdist",
    "git_url",
    "git_subdirectory",
    "sources",
    "submodules",
    "slim",
    "stable_abi_from",
    "per_torch",
    "parallel_env",
    "extension_units",
}
_SOURCE_KINDS = ("pypi-sdist", "git", "path", "url")
_GRAMMAR_FIELDS = {"distribution", "label", "torch_match", "archs", "example", "sources"}


def parse_recipes(doc: Mapping[str, Any], errors: Collector) -> dict[str, Recipe]:
    """Read ``[recipes.*]``, recording every bad field in ``errors``."""
    out: dict[str, Recipe] = {}
    for rid, raw, path in errors.rows(doc, "recipes", _RECIPE_FIELDS):
        kind = _enum(errors, raw, "kind", path, enum=RecipeKind, fallback=RecipeKind.BUILD)
        targets = _targets(errors, raw, "targets", path)
        if kind is RecipeKind.BUILD and "targets" in raw and not targets and raw.get("arch_env"):
            errors.add(f"{path}.targets", "a build recipe with an arch variable needs at least one target")
        kinds = errors.str_list(raw, "source_kinds", path, allow_empty=False)
        for i, k in enumerate(kinds):
            if k not in _SOURCE_KINDS:
                errors.add(f"{path}.source_kinds[{i}]", f"expected one of {_SOURCE_KINDS}, got {k!r}")
        threads = errors.get(raw, "nvcc_threads", path, int)
        gb = errors.get(raw, "gb_per_nvcc_thread", path, int)
        units: list[int] = []
        for i, u in enumerate(errors.get(raw, "extension_units", path, list, [])):
            if isinstance(u, int) and not isinstance(u, bool) and u > 0:
                units.append(u)
            else:
                errors.add(f"{path}.extension_units[{i}]", f"expected a positive int, got {u!r}")
        if raw.get("parallel_env") and not units:
            errors.add(f"{path}.extension_units", "parallel_env needs the extension modules' translation units")
        for key, value in (("nvcc_threads", threads), ("gb_per_nvcc_thread", gb)):
            if key in raw and value <= 0:
                errors.add(f"{path}.{key}", "must be positive")
        out[rid] = Recipe(
            id=rid,
            kind=kind,
            distribution=errors.get(raw, "distribution", path, str),
            arch_env=errors.get(raw, "arch_env", path, str),
            arch_format=_enum(
                errors, raw, "arch_format", path, enum=ArchFormat, fallback=ArchFormat.DOTTED
            ),
            targets=targets,
            adds_ptx=errors.get(raw, "adds_ptx", path, bool),
            min_nvcc=errors.parsed(
                errors.get(raw, "min_nvcc", path, str), f"{path}.min_nvcc", parse_major_minor, (0, 0)
            ),
            min_nvcc_targets=_min_nvcc_targets(errors, raw, path),
            env=_str_table(errors, raw, "env", path),
            nvcc_threads=max(threads, 1),
            gb_per_nvcc_thread=max(gb, 1),
            min_free_disk_gb=errors.get(raw, "min_free_disk_gb", path, float),
            source_kinds=kinds,
            sdist=errors.get(raw, "sdist", path, str),
            git_url=errors.get(raw, "git_url", path, str),
            git_subdirectory=errors.get(raw, "git_subdirectory", path, str),
            sources=errors.str_list(raw, "sources", path, allow_empty=False),
            submodules=tuple(str(m) for m in raw.get("submodules", ())),
            slim=parse_slim(raw.get("slim"), f"{path}.slim", errors),
            stable_abi_from=errors.parsed(errors.get(raw, "stable_abi_from", path, str), f"{path}.stable_abi_from",
                                          parse_major_minor, None) if "stable_abi_from" in raw else None,
            per_torch=_source_edit(errors, raw.get("per_torch"), f"{path}.per_torch"),
            per_torch_also=_also_edits(errors, raw.get("per_torch"), f"{path}.per_torch.also"),
            parallel_env=errors.get(raw, "parallel_env", path, str, ""),
            extension_units=tuple(units),
        )
        if out[rid].per_torch is not None and out[rid].stable_abi_from is None:
            errors.add(f"{path}.per_torch", "only a recipe with stable_abi_from builds for the stable ABI by default")
    for rid in (GENERIC_RECIPE, CPP_RECIPE) if "recipes" in doc else ():
        if rid not in out:
            errors.add(f"recipes.{rid}", "missing (a recipe for sources the catalog does not know)")
    return out


def _source_edit(errors: Collector, raw: Any, path: str) -> SourceEdit | None:
    """``[recipes.ID.per_torch]``: ``file``, ``find``, ``replace`` (non-empty strings), ``gain`` (optional),
    ``sources`` and ``also`` (:func:`_also_edits`)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        errors.add(path, "expected a table with file, find, replace and sources")
        return None
    edit = _edit(errors, raw, path, {"gain", "sources", "also"})
    errors.str_list(raw, "sources", path, allow_empty=False)
    if edit is None:
        return None
    gain = errors.get(raw, "gain", path, str) if "gain" in raw else None
    return dataclasses.replace(edit, gain=gain) if gain else edit


def _also_edits(errors: Collector, raw: Any, path: str) -> tuple[SourceEdit, ...]:
    """``[[recipes.ID.per_torch.also]]``: further edits made with the binding one, each ``file``, ``find`` and
    ``replace`` (non-empty strings; the binding edit's ``sources`` cover them)."""
    items = raw.get("also", []) if isinstance(raw, Mapping) else []
    if not isinstance(items, list):
        errors.add(path, "expected an array of tables with file, find and replace")
        return ()
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            errors.add(f"{path}[{i}]", "expected a table with file, find and replace")
        elif (edit := _edit(errors, item, f"{path}[{i}]", set())) is not None:
            out.append(edit)
    return tuple(out)


def _edit(errors: Collector, raw: Mapping[str, Any], path: str, more: set[str]) -> SourceEdit | None:
    """One edit's ``file``, ``find`` and ``replace`` (non-empty strings; ``more``: the other fields its table may
    hold), or None where any is missing or empty (each recorded in ``errors``)."""
    unknown = sorted(set(raw) - {"file", "find", "replace"} - more)
    if unknown:
        errors.add(path, f"unknown field(s) {unknown}")
    texts = {key: errors.get(raw, key, path, str) for key in ("file", "find", "replace")}
    for key, text in texts.items():
        if key in raw and not text:
            errors.add(f"{path}.{key}", "must not be empty")
    if not all(texts.values()):
        return None
    return SourceEdit(file=texts["file"], find=texts["find"], replace=texts["replace"])


def parse_wheel_grammars(doc: Mapping[str, Any], errors: Collector) -> dict[str, WheelGrammar]:
    """Read ``[wheel_grammars.*]``; each grammar must parse its own ``example``."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    out: dict[str, WheelGrammar] = {}
    for gid, raw, path in errors.rows(doc, "wheel_grammars", _GRAMMAR_FIELDS):
        label = errors.get(raw, "label", path, str)
        for name in re.findall(r"\{([^}]*)\}", label):
            if name not in _FIELD_RE:
                errors.add(f"{path}.label", f"unknown field {{{name}}}; known: {sorted(_FIELD_RE)}")
        grammar = WheelGrammar(
            id=gid,
            distribution=errors.get(raw, "distribution", path, str),
            label=label,
            torch_match=_enum(
                errors, raw, "torch_match", path, enum=TorchMatch, fallback=TorchMatch.NONE
            ),
            archs=_targets(errors, raw, "archs", path),
            example=errors.get(raw, "example", path, str),
            sources=errors.str_list(raw, "sources", path, allow_empty=False),
        )
        out[gid] = grammar
        if not grammar.example or any(p.startswith(f"{path}.label") for p in errors.problems):
            continue
        try:
            _, version, _, _ = parse_wheel_filename(grammar.example)
        except InvalidWheelFilename as exc:
            errors.add(f"{path}.example", str(exc))
            continue
        if version.local is None or grammar.parse(version.local) is None:
            errors.add(f"{path}.example", f"its label {version.local!r} does not fit {label!r}")
    return out


def _enum(errors: Collector, raw: Mapping[str, Any], key: str, path: str, *, enum: Any, fallback: Any) -> Any:
    text = errors.get(raw, key, path, str)
    try:
        return enum(text)
    except ValueError:
        if key in raw:
            errors.add(f"{path}.{key}", f"expected one of {[e.value for e in enum]}, got {text!r}")
        return fallback


def _targets(errors: Collector, raw: Mapping[str, Any], key: str, path: str) -> tuple[Target, ...]:
    out = []
    for i, name in enumerate(errors.str_list(raw, key, path)):
        try:
            out.append(Target.parse(name))
        except ValueError as exc:
            errors.add(f"{path}.{key}[{i}]", str(exc))
    return tuple(out)


def _str_table(errors: Collector, raw: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    table = errors.get(raw, key, path, dict)
    out = {}
    for k, v in table.items():
        if isinstance(v, str):
            out[str(k)] = v
        else:
            errors.add(f"{path}.{key}.{k}", f"expected str, got {type(v).__name__} {v!r}")
    return out


def _min_nvcc_targets(errors: Collector, raw: Mapping[str, Any], path: str) -> dict[str, MajorMinor]:
    out = {}
    for name, text in _str_table(errors, raw, "min_nvcc_targets", path).items():
        sub = f"{path}.min_nvcc_targets.{name}"
        try:
            Target.parse(name)
        except ValueError as exc:
            errors.add(sub, str(exc))
            continue
        out[name] = errors.parsed(text, sub, parse_major_minor, (0, 0))
    return out


__all__ = [
    "CPP_RECIPE",
    "GENERIC_RECIPE",
    "ArchFormat",
    "CudaTag",
    "Recipe",
    "RecipeKind",
    "TorchMatch",
    "WheelGrammar",
    "WheelLabel",
    "format_major_minor",
    "parse_recipes",
    "parse_wheel_grammars",
]

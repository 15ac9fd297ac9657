"""Slim builds: a recipe's own switches that leave head dims, dtypes, backward or features out of a build.

The data is ``[recipes.ID.slim]`` in ``catalog/data/backends.toml`` (FlashAttention-3's
``FLASH_ATTENTION_DISABLE_*``); :func:`plan_slim` maps a :class:`SlimRequest` (``--head-dim 128 --dtype bf16
--no-backward --features varlen``) to those switches, says what the build leaves out, counts the translation
units it keeps and estimates both build times. What the binary can then run travels with it as
:class:`Capabilities` (cache key flags and provenance).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attnforge.catalog._check import Collector
from attnforge.errors import UsageError

#: What people type -> torch's dtype name (the names the backend tables and ``capabilities.dtypes`` use).
DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
    "fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
    "fp32": "float32", "float32": "float32",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SlimRequest:
    """What a slim build must keep. ``head_dims``/``dtypes`` empty = all; ``features`` lists the optional
    features to keep (the others are left out)."""

    head_dims: tuple[int, ...] = ()
    dtypes: tuple[str, ...] = ()
    backward: bool = True
    features: tuple[str, ...] = ()
    head_dim_pairs: tuple[tuple[int, int], ...] = ()  # (qk, v) with v != qk: DeepSeek's 192x128


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a built binary can run. The JSON keys (``head_dims``, ``dtypes``, ``backward``, ``features``) are
    the contract with verify, bench and the dispatcher."""

    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    backward: bool
    features: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"head_dims": list(self.head_dims), "dtypes": list(self.dtypes), "backward": self.backward,
                "features": list(self.features)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Capabilities:
        """Raises: ValueError when a key is missing or of the wrong type."""
        try:
            return cls(head_dims=tuple(int(d) for d in data["head_dims"]),
                       dtypes=tuple(str(d) for d in data["dtypes"]), backward=bool(data["backward"]),
                       features=tuple(str(f) for f in data["features"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad capabilities {dict(data)!r}: {exc}") from None

    def describe(self) -> str:
        """``"head dims 128; dtypes bfloat16; backward yes; features none"``."""
        return (f"head dims {', '.join(map(str, self.head_dims)) or 'all'}; dtypes {', '.join(self.dtypes)}; "
                f"backward {'yes' if self.backward else 'no'}; features {', '.join(self.features) or 'none'}")

    def outside(self, *, dtype: str, head_dim: int, backward: bool = False) -> str | None:
        """Why a case is outside these capabilities (``"this build has no float16 kernels"``), or None."""
        if backward and not self.backward:
            return "this build has no backward kernels (forward only)"
        if dtype not in self.dtypes:
            return f"this build has no {dtype} kernels (it has {', '.join(self.dtypes)})"
        if not any(head_dim <= d for d in self.head_dims):
            return f"this build has no head dim {head_dim} kernels (it has {', '.join(map(str, self.head_dims))})"
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """One recorded build: ``units`` translation units in ``seconds`` on ``cores`` cores."""

    units: int
    seconds: float
    cores: int
    where: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SlimSwitches:
    """A recipe's slim switches (``[recipes.ID.slim]``); ``unsupported`` says why a recipe has none."""

    value: str = "TRUE"
    head_dims: Mapping[int, str] = field(default_factory=dict)
    dtypes: Mapping[str, str] = field(default_factory=dict)
    always_dtypes: tuple[str, ...] = ()
    backward: str = ""
    features: Mapping[str, str] = field(default_factory=dict)
    head_dim_pairs: Mapping[str, str] = field(default_factory=dict)  # "192x128" -> the feature that holds it
    arch_switches: Mapping[int, str] = field(default_factory=dict)
    units_model: str = ""
    full_units: int = 0
    timing: Timing | None = None
    unsupported: str = ""
    sources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SlimPlan:
    """A slim build decided: the switches (``env``), what it leaves out, and the two estimates."""

    env: Mapping[str, str]
    left_out: tuple[str, ...]
    capabilities: Capabilities
    units: int | None
    full_units: int | None
    estimate_s: float | None
    full_estimate_s: float | None
    note: str


_FIELDS = {"value", "head_dims", "dtypes", "always_dtypes", "backward", "features", "head_dim_pairs",
           "arch_switches", "units_model", "full_units", "timing", "unsupported", "sources"}


def parse_slim(raw: Any, path: str, errors: Collector) -> SlimSwitches | None:
    """Read one ``[recipes.ID.slim]`` table (None when the recipe has none)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        errors.add(path, f"expected a table, got {type(raw).__name__}")
        return None
    for key in set(raw) - _FIELDS:
        errors.add(f"{path}.{key}", f"unknown field; known: {sorted(_FIELDS)}")
    timing = raw.get("timing")
    t = None
    if isinstance(timing, Mapping):
        t = Timing(units=errors.get(timing, "units", f"{path}.timing", int),
                   seconds=errors.get(timing, "seconds", f"{path}.timing", float),
                   cores=errors.get(timing, "cores", f"{path}.timing", int),
                   where=errors.get(timing, "where", f"{path}.timing", str))
    model = str(raw.get("units_model", ""))
    if model and model not in _UNIT_MODELS:
        errors.add(f"{path}.units_model", f"expected one of {sorted(_UNIT_MODELS)}, got {model!r}")
    def table(key: str) -> dict[str, str]:
        value = raw.get(key, {})
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            errors.add(f"{path}.{key}", "expected a table of strings")
            return {}
        return {str(k): v for k, v in value.items()}

    return SlimSwitches(
        value=errors.get(raw, "value", path, str, "TRUE"),
        head_dims=_int_keys(table("head_dims"), f"{path}.head_dims", errors),
        dtypes=table("dtypes"),
        always_dtypes=tuple(errors.str_list(raw, "always_dtypes", path)) if "always_dtypes" in raw else (),
        backward=errors.get(raw, "backward", path, str, ""),
        features=table("features"),
        head_dim_pairs=table("head_dim_pairs"),
        arch_switches=_int_keys(table("arch_switches"), f"{path}.arch_switches", errors),
        units_model=model, full_units=errors.get(raw, "full_units", path, int, 0), timing=t,
        unsupported=errors.get(raw, "unsupported", path, str, ""),
        sources=errors.str_list(raw, "sources", path, allow_empty=False),
    )


def _int_keys(table: Mapping[str, str], path: str, errors: Collector) -> dict[int, str]:
    out: dict[int, str] = {}
    for k, v in table.items():
        if not str(k).isdigit():
            errors.add(f"{path}.{k}", "expected a number as the key")
            continue
        out[int(k)] = v
    return out


def plan_slim(recipe_id: str, switches: SlimSwitches | None, request: SlimRequest,
              *, archs: tuple[tuple[int, int], ...], max_jobs: int) -> SlimPlan:
    """Map ``request`` to ``switches``.

    Raises:
        UsageError: a head dim, dtype or feature this recipe cannot build.
    """
    if switches is None or switches.unsupported:
        why = switches.unsupported if switches else f"{recipe_id} has no build switches attnforge knows"
        everything = Capabilities(head_dims=(), dtypes=(), backward=True, features=())  # not used: no env
        return SlimPlan(env={}, left_out=(), capabilities=everything, units=None,
                        full_units=None, estimate_s=None, full_estimate_s=None,
                        note=f"no slim build: {why}; the full build is planned")
    wanted_dims, features = list(request.head_dims), list(request.features)
    for qk, v in request.head_dim_pairs:  # a pair needs its qk kernel and, where it has one, its own feature
        feature = switches.head_dim_pairs.get(f"{qk}x{v}")
        wanted_dims += [qk] if feature else [qk, v]
        features += [feature] if feature and feature not in features else []
    dims = _kept_dims(recipe_id, switches, tuple(wanted_dims))
    dtypes = _kept_dtypes(recipe_id, switches, request.dtypes)
    unknown = sorted(set(request.features) - set(switches.features))
    if unknown:
        raise UsageError(f"{recipe_id} has no build feature {', '.join(unknown)}",
                         hint=f"its features: {', '.join(sorted(switches.features))}")
    disabled: dict[str, str] = {}
    left_out: list[str] = []
    tables: tuple[tuple[str, Mapping[Any, str], Any], ...] = (
        ("head dims", switches.head_dims, dims), ("dtypes", switches.dtypes, dtypes),
        ("features", switches.features, features))
    for what, table, kept in tables:
        off = [k for k in table if k not in kept]
        disabled.update({table[k]: switches.value for k in off})
        if off:
            left_out.append(f"{what} {', '.join(map(str, off))}")
    if not request.backward and switches.backward:
        disabled[switches.backward] = switches.value
        left_out.append("the backward pass (inference only)")
    majors = {major for major, _ in archs}
    for major, var in switches.arch_switches.items():
        if major not in majors:
            disabled[var] = switches.value
            left_out.append(f"sm_{major}x kernels (no {major}.x target)")
    all_dtypes = (*switches.always_dtypes, *switches.dtypes)
    caps = Capabilities(head_dims=tuple(sorted(dims)), dtypes=tuple(d for d in all_dtypes if d in dtypes),
                        backward=request.backward or not switches.backward,
                        features=tuple(f for f in switches.features if f in features))
    units = count_units(switches.units_model, set(disabled)) if switches.units_model else None
    full = switches.full_units or (count_units(switches.units_model, set()) if switches.units_model else None)
    return SlimPlan(env=dict(sorted(disabled.items())), left_out=tuple(left_out), capabilities=caps,
                    units=units, full_units=full, estimate_s=estimate_s(switches.timing, units, max_jobs),
                    full_estimate_s=estimate_s(switches.timing, full, max_jobs), note="")


def _kept_dims(recipe_id: str, switches: SlimSwitches, wanted: tuple[int, ...]) -> set[int]:
    if not wanted:
        return set(switches.head_dims)
    kept = set()
    for d in wanted:
        fitting = [k for k in sorted(switches.head_dims) if d <= k]  # kernels round the head dim up
        if not fitting:
            raise UsageError(f"{recipe_id} has no kernels for head dim {d}",
                             hint=f"its head dims: {', '.join(map(str, sorted(switches.head_dims)))}")
        kept.add(fitting[0])
    return kept


def _kept_dtypes(recipe_id: str, switches: SlimSwitches, wanted: tuple[str, ...]) -> set[str]:
    known = (*switches.always_dtypes, *switches.dtypes)
    if not wanted:
        return set(known)
    bad = [d for d in wanted if d not in known]
    if bad:
        raise UsageError(f"{recipe_id} has no {', '.join(bad)} kernels", hint=f"its dtypes: {', '.join(known)}")
    return set(wanted) | set(switches.always_dtypes)


def estimate_s(timing: Timing | None, units: int | None, max_jobs: int) -> float | None:
    """Seconds for ``units`` translation units at ``max_jobs`` in parallel, scaled from one recorded build:
    each parallel wave of units costs what the recorded build's waves cost (an estimate: units differ)."""
    if timing is None or units is None or timing.units <= 0:
        return None
    recorded_waves = math.ceil(timing.units / max(timing.cores, 1))
    per_wave = timing.seconds / recorded_waves
    return math.ceil(units / max(max_jobs, 1)) * per_wave


def parse_dtypes(values: tuple[str, ...]) -> tuple[str, ...]:
    """``("bf16,fp16",)`` -> ``("bfloat16", "float16")``.

    Raises:
        UsageError: an unknown dtype.
    """
    out: list[str] = []
    for item in _items(values):
        name = DTYPE_ALIASES.get(item.lower())
        if name is None:
            raise UsageError(f"unknown dtype {item!r}", hint=f"write one of {', '.join(sorted(DTYPE_ALIASES))}")
        if name not in out:
            out.append(name)
    return tuple(out)


def parse_head_dims(values: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """``("64,128,192x128",)`` -> ``((64, 128), ((192, 128),))``: head dims, and (qk, v) pairs whose v differs.

    Raises:
        UsageError: not a positive integer or ``QKxV``.
    """
    dims: set[int] = set()
    pairs: set[tuple[int, int]] = set()
    for item in _items(values):
        qk, x, v = item.lower().partition("x")
        if not qk.isdigit() or int(qk) <= 0 or (x and (not v.isdigit() or int(v) <= 0)):
            raise UsageError(f"not a head dim: {item!r}", hint="write e.g. --head-dim 64,128 or 192x128 (qk x v)")
        if x and int(v) != int(qk):
            pairs.add((int(qk), int(v)))
        else:
            dims.add(int(qk))
    return tuple(sorted(dims)), tuple(sorted(pairs))


def _items(values: tuple[str, ...]) -> list[str]:
    return [t.strip() for v in values for t in v.replace(";", ",").split(",") if t.strip()]


def _fa3_hopper_units(disabled: set[str]) -> int:
    """Translation units of hopper/setup.py (flash-attention 0251105, lines 592-662): the instantiation
    files its itertools.product over head dims, dtypes, split, paged, softcap and packgqa keeps, plus
    flash_api, flash_fwd_combine (unless split is off) and flash_prepare_scheduler."""
    def off(name: str) -> bool:
        return f"FLASH_ATTENTION_DISABLE_{name}" in disabled

    half = ["bf16"] + ([] if off("FP16") else ["fp16"])
    fwd90 = half + ([] if off("FP8") else ["e4m3"])
    dims = [h for h in (64, 96, 128, 192, 256) if not off(f"HDIM{h}")]
    split, paged = [False, not off("SPLIT")], [False, not off("PAGEDKV")]
    softcap = 1 + (not off("SOFTCAP"))
    packgqa = [False, True]  # PACKGQA is not switched by attnforge

    def fwd90_units(hdims: list[Any], types: list[str]) -> int:
        combos = {(s, p, g) for s, p, g in itertools.product(set(split), set(paged), packgqa)
                  if not (g and (s or p))}
        return len(hdims) * len(types) * softcap * len(combos)

    variants = len(set(split)) * len(set(paged))
    n = 1 + fwd90_units(dims, fwd90) + len(dims) * len(half)  # flash_api + fwd sm90 + bwd sm90 (softcapall)
    n += 0 if off("HDIMDIFF64") else fwd90_units(["64_256", "64_512"], half)
    n += 0 if off("HDIMDIFF192") else fwd90_units(["192_128"], fwd90)
    if not off("SM80"):
        n += len(dims) * len(half) * variants  # fwd sm80 (softcapall)
        n += 0 if off("BACKWARD") else len(dims) * len(half) * softcap  # bwd sm80
    if off("BACKWARD"):
        n -= len(dims) * len(half)
    return n + (0 if off("SPLIT") else 1) + 1


_UNIT_MODELS = {"fa3-hopper": _fa3_hopper_units}


def count_units(model: str, disabled: set[str]) -> int:
    """Translation units a build keeps with these switches set."""
    return _UNIT_MODELS[model](disabled)

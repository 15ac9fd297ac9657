"""What a backend can serve, as data: ``catalog/data/backends.toml`` plus ``catalog/data/runtime.toml``.

The support check is a pure function of a :class:`Capabilities` and an :class:`AttentionCall`, so a decision
can be replayed and tested without a GPU or the backend's package.

Causal alignment rule (applies to every backend): ``attention(..., causal=True)`` aligns the mask to the
bottom-right, i.e. query ``i`` sees key ``j`` when ``j <= i + Sk - Sq`` (FlashAttention >= 2.1). When Sq == Sk
this is the same as SDPA's top-left ``is_causal``. Backends whose ``causal`` mode is ``"mask"`` (SDPA
efficient, cuDNN, math) get an explicit bottom-right boolean mask when Sq != Sk; ``"square-only"`` backends
(SDPA flash, SageAttention) accept no mask and are refused for causal calls with Sq != Sk.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge._compat import StrEnum
from attnforge.backends.adapter import FEATURES, AttentionCall, required_features
from attnforge.catalog import DATA_DIR, Catalog, load_catalog
from attnforge.catalog._check import Collector, read_checked
from attnforge.catalog.backends import Support
from attnforge.types.cc import ComputeCapability, format_cc
from attnforge.types.device import DeviceType
from attnforge.types.shapes import Layout

_FIELDS = {
    "devices", "layout", "causal", "empty_rows_zero", "gqa", "backward", "head_dim_multiple", "sources",
    "features", "offers", "backward_devices", "jit_per_shape", "jit_per_variant", "win_required_on",
    "gqa_masked_min_seqlen_q", "mask_max_seqlen_q", "mask_with",
}
DEVICES = tuple(d.value for d in DeviceType)


class CausalMode(StrEnum):
    """How a kernel masks causally (see the module docstring for the alignment rule)."""

    BOTTOM_RIGHT = "bottom-right"
    MASK = "mask"
    SQUARE_ONLY = "square-only"
    NONE = "none"


class GqaMode(StrEnum):
    """How a kernel serves Hq != Hkv: natively, or by the adapter repeating K/V heads."""

    NATIVE = "native"
    EXPAND = "expand"


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """Everything the dispatcher checks before it calls a backend.

    Attributes:
        backend: catalog id.
        devices: torch device types the kernel runs on.
        support: the catalog row's compute capability range (on CUDA), dtypes and largest head dim D
            (:class:`~attnforge.catalog.backends.Support`; a slim build narrows it).
        head_dim_multiple: D must be a multiple of this.
        layout: the kernel's native layout.
        causal: causal masking mode.
        empty_rows_zero: rows with no visible key come back as zeros (causal, Sq > Sk).
        gqa: how Hq != Hkv is served.
        backward: the kernel has a backward pass.
        quantized: the kernel quantizes Q/K/V (served only with precision="allow_quantized").
        priority: tie-break when nothing was measured, lower first.
        features: the optional features (:data:`~attnforge.backends.adapter.FEATURES`) the adapter serves.
        offers: features the kernel has that attnforge does not route to it yet (documented, never used).
        backward_devices: device types with a backward pass (all of ``devices`` when ``backward``).
        jit_per_shape: the kernel is compiled per exact shape (FlexAttention), so it is only chosen where a
            measurement showed it winning (see :mod:`attnforge.dispatch.runtime`).
        jit_per_variant: the kernel is compiled on its first call for each variant (dtype, head dim, causal,
            features; FlashAttention-4's CuTe DSL kernels), seconds each, so measure-on-first-use leaves it out
            (:mod:`attnforge.dispatch.autotune`); ``attnforge warmup``, bench and background measuring time it.
        win_required_on: device types where the backend is chosen only when bench measured it faster than
            plain SDPA for the call's shape class (a forced SDPA kernel on CPU can at best match plain SDPA).
        gqa_masked_min_seqlen_q: on CUDA, a GQA call (Hq != Hkv) with a causal or window mask needs Sq >= this
            (0: any Sq); FlexAttention's kernel fails to compile below one query block (``runtime.toml``).
        mask_max_seqlen_q: a mask (``attn_mask``) only on calls of at most this many query rows (0: any Sq):
            FlashAttention-4 serves a decode step's padding mask as varlen sequences (``runtime.toml``).
        mask_with: the features a masked call may carry beside the mask (None: any of ``features``); a masked call
            with another one is not this backend's (FlashAttention-4's padded decode route serves a mask beside
            softcap and a window that hides no key, and would give anything else, sinks say, to its exact math).
    """

    backend: str
    devices: tuple[str, ...]
    support: Support
    head_dim_multiple: int
    layout: Layout
    causal: CausalMode
    empty_rows_zero: bool
    gqa: GqaMode
    backward: bool
    quantized: bool
    priority: int
    features: frozenset[str] = frozenset()
    offers: frozenset[str] = frozenset()
    backward_devices: tuple[str, ...] | None = None
    jit_per_shape: bool = False
    jit_per_variant: bool = False
    win_required_on: tuple[str, ...] = ()
    gqa_masked_min_seqlen_q: int = 0
    mask_max_seqlen_q: int = 0
    mask_with: frozenset[str] | None = None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        """Every reason this backend cannot serve ``call``; empty when it can. Pure."""
        reasons: list[str] = []
        if call.device_type not in self.devices:
            reasons.append(f"runs on {'/'.join(self.devices)}, the tensors are on {call.device_type}")
        elif call.device_type == "cuda":
            cc = call.compute_capability
            if cc is None or not self.support.supports_cc(ComputeCapability(*cc)):
                have = "unknown" if cc is None else format_cc(cc)
                reasons.append(f"supports compute capability {self.support.cc_range_text()}, this GPU is {have}")
        if call.dtype not in self.support.dtypes:
            reasons.append(f"dtype {call.dtype} not supported ({', '.join(self.support.dtypes)})")
        if call.head_dim > self.support.max_head_dim:
            reasons.append(f"head dim {call.head_dim} > {self.support.max_head_dim}")
        if call.head_dim % self.head_dim_multiple:
            reasons.append(f"head dim {call.head_dim} is not a multiple of {self.head_dim_multiple}")
        if call.causal:
            if self.causal is CausalMode.NONE:
                reasons.append("no causal masking")
            elif self.causal is CausalMode.SQUARE_ONLY and call.seqlen_q != call.seqlen_k:
                reasons.append(f"causal only with Sq == Sk (top-left aligned, no mask argument);"
                               f" got Sq={call.seqlen_q}, Sk={call.seqlen_k}")
            elif call.seqlen_q > call.seqlen_k and not self.empty_rows_zero:
                reasons.append(f"causal with Sq={call.seqlen_q} > Sk={call.seqlen_k} leaves rows with no key,"
                               " and this kernel's output for them is not known to be zero")
        if (call.device_type == "cuda" and call.seqlen_q < self.gqa_masked_min_seqlen_q
                and call.heads_q != call.heads_kv and (call.causal or "window" in required_features(call))):
            reasons.append(f"GQA with a causal or window mask needs Sq >= {self.gqa_masked_min_seqlen_q} on CUDA"
                           f" (the kernel fails to compile below it); got Sq={call.seqlen_q}")
        if call.needs_grad:
            if not self.backward:
                reasons.append("no backward pass (inference only), and an input requires grad")
            elif self.backward_devices is not None and call.device_type not in self.backward_devices:
                reasons.append(f"no backward pass on {call.device_type}, and an input requires grad")
        needed = required_features(call)
        if self.mask_max_seqlen_q and call.seqlen_q > self.mask_max_seqlen_q and "mask" in needed:
            reasons.append(f"a mask only on a decode step (Sq <= {self.mask_max_seqlen_q}); got Sq={call.seqlen_q}")
        if self.mask_with is not None and "mask" in needed and (beside := needed - {"mask"} - self.mask_with):
            allowed = ", ".join(sorted(self.mask_with)) or "no other feature"
            reasons.append(f"a mask only beside {allowed}; the call also has {', '.join(sorted(beside))}")
        missing = needed - self.features
        if missing:
            reasons.append(f"does not support {', '.join(sorted(missing))}")
        if self.quantized and call.precision != "allow_quantized":
            reasons.append("quantizes Q/K/V; used only with precision='allow_quantized'")
        return reasons


def load_capabilities(
    catalog: Catalog | None = None, data_dir: Path | None = None
) -> dict[str, Capabilities]:
    """Join the catalog's backend rows with ``runtime.toml`` into one :class:`Capabilities` per backend id.

    Args:
        catalog: the loaded catalog (the packaged one when None).
        data_dir: the directory holding ``runtime.toml`` (the packaged data when None).

    Raises:
        CatalogError: ``runtime.toml`` is invalid or its ids differ from ``backends.toml``; every bad dotted
            path is listed.
    """
    if catalog is None and data_dir is None:
        return dict(_packaged())
    return _load(catalog or load_catalog(), data_dir or DATA_DIR)


@functools.cache
def _packaged() -> Mapping[str, Capabilities]:
    return _load(load_catalog(), DATA_DIR)


def _load(catalog: Catalog, data_dir: Path) -> dict[str, Capabilities]:
    doc, errors = read_checked(data_dir / "runtime.toml")  # the catalog's one reader: schema check included
    out: dict[str, Capabilities] = {}
    with errors.table(doc, "runtime", "") as tables:
        for bid in sorted(set(catalog.backends) - set(tables)):
            errors.add(f"runtime.{bid}", "missing (every backend of backends.toml needs a runtime row)")
        for bid, raw in tables.items():
            path = f"runtime.{bid}"
            backend = catalog.backends.get(bid)
            if backend is None:
                errors.add(path, "not a backend of backends.toml")
                continue
            if not isinstance(raw, dict):
                errors.add(path, "expected a table")
                continue
            errors.unknown_keys(raw, _FIELDS, path)
            devices = errors.str_list(raw, "devices", path, allow_empty=False)
            for i, dev in enumerate(devices):
                if dev not in DEVICES:
                    errors.add(f"{path}.devices[{i}]", f"expected one of {DEVICES}, got {dev!r}")
            multiple = errors.get(raw, "head_dim_multiple", path, int)
            if multiple is not None and multiple <= 0:
                errors.add(f"{path}.head_dim_multiple", "must be positive")
            errors.str_list(raw, "sources", path, allow_empty=False)
            features = _features(errors, raw, "features", path)
            offers = _features(errors, raw, "offers", path)
            backward_devices = (errors.str_list(raw, "backward_devices", path) if "backward_devices" in raw
                                else None)
            out[bid] = Capabilities(
                backend=bid,
                devices=devices,
                support=backend.support,
                head_dim_multiple=multiple or 1,
                layout=_enum(errors, raw, "layout", path, Layout),
                causal=_enum(errors, raw, "causal", path, CausalMode),
                empty_rows_zero=errors.get(raw, "empty_rows_zero", path, bool),
                gqa=_enum(errors, raw, "gqa", path, GqaMode),
                backward=errors.get(raw, "backward", path, bool),
                quantized=backend.quantized,
                priority=backend.priority,
                features=features,
                offers=offers,
                backward_devices=backward_devices,
                jit_per_shape=errors.get(raw, "jit_per_shape", path, bool, False),
                jit_per_variant=errors.get(raw, "jit_per_variant", path, bool, False),
                win_required_on=(errors.str_list(raw, "win_required_on", path) if "win_required_on" in raw
                                 else ()),
                gqa_masked_min_seqlen_q=errors.get(raw, "gqa_masked_min_seqlen_q", path, int, 0),
                mask_max_seqlen_q=errors.get(raw, "mask_max_seqlen_q", path, int, 0),
                mask_with=_features(errors, raw, "mask_with", path) if "mask_with" in raw else None,
            )
    errors.finish()
    return out


def _features(errors: Collector, raw: Mapping[str, Any], key: str, path: str) -> frozenset[str]:
    if key not in raw:
        return frozenset()
    names = errors.str_list(raw, key, path)
    for i, name in enumerate(names):
        if name not in FEATURES:
            errors.add(f"{path}.{key}[{i}]", f"unknown feature {name!r} (known: {', '.join(FEATURES)})")
    return frozenset(names) & frozenset(FEATURES)


def _enum(errors: Collector, raw: Mapping[str, Any], key: str, path: str, kind: type[StrEnum]) -> Any:
    text = errors.get(raw, key, path, str)
    try:
        return kind(text)
    except ValueError:
        if text:
            errors.add(f"{path}.{key}", f"expected one of {[m.value for m in kind]}, got {text!r}")
        return next(iter(kind))


#: The capabilities of the always-available fallback: PyTorch SDPA with no backend forced.
SDPA_FALLBACK = Capabilities(
    backend="sdpa",
    devices=DEVICES,
    support=Support(min_cc=ComputeCapability(0, 0), max_cc=ComputeCapability(99, 9),
                    dtypes=("float16", "bfloat16", "float32", "float64"), max_head_dim=1 << 30),
    head_dim_multiple=1,
    layout=Layout.BHSD,
    causal=CausalMode.MASK,
    empty_rows_zero=True,
    gqa=GqaMode.NATIVE,
    backward=True,
    quantized=False,
    priority=1000,
    # what the SDPA adapter serves through SDPA's own arguments (attn_mask, dropout_p, top-left is_causal,
    # Dv != D) or by building a boolean mask (window): runtime-anchors.md §3.1, §3.3 (math: masks, any head dim)
    features=frozenset({"mask", "dropout", "causal_top_left", "window", "dv"}),
)

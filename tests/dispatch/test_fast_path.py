"""The hot path of attention(): routes remembered per exact call signature, and native-layout adapters.

A route skips validation and the decision, so every test here checks that something that changes either
(a broken backend, a forced backend, re-read records, another shape, dtype or device, bad input) is seen on
the next call, and that BSHD kernels get the caller's tensors without a transpose.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import attnforge
from attnforge.backends import registry
from attnforge.backends._base import Requirement
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.backends.external import SageAdapter, XformersAdapter
from attnforge.backends.flash import FlashAttnAdapter
from attnforge.dispatch import dispatcher as dispatcher_module
from attnforge.dispatch import runtime
from attnforge.errors import DispatchError
from attnforge.records import RecordStore, VerifyRecord, device_key
from attnforge.types.cc import ComputeCapability
from tests._fakes import count_calls
from tests.dispatch._measured import record_faster_over

CPU_KEY = device_key("cpu", None, torch.__version__)


@dataclasses.dataclass
class Fake:
    """A backend at the seam: reference math, optional failure and dtype limits; counts decisions and calls."""

    name: str
    raises: Exception | None = None
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
    decided: int = 0
    calls: int = 0

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        self.decided += 1
        return [] if call.dtype in {str(d).removeprefix("torch.") for d in self.dtypes} else ["dtype"]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        self.calls += 1
        if self.raises is not None:
            raise self.raises
        return reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype)


@dataclasses.dataclass
class FakeBshd(Fake):
    """A backend whose kernel takes ``[B, S, H, D]``: records what its native entry received."""

    received: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def call_bshd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                  scale: float | None) -> torch.Tensor:
        self.received = [q, k, v]
        return self(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                    scale=scale).transpose(1, 2)


@pytest.fixture
def store(tmp_path: Path) -> RecordStore:
    return RecordStore(tmp_path / "home")


def _install(store: RecordStore, *fakes: Fake, verified: tuple[str, ...] | None = None) -> Iterator[Any]:
    for name in verified if verified is not None else tuple(f.name for f in fakes):
        store.add_verify(VerifyRecord(device_key=CPU_KEY, backend=name, backend_version="1", ok=True,
                                      summary="ok"))
    record_faster_over(store, [f.name for f in fakes], heads_q_kv=((4, 2), (2, 2)), seqlens=(4, 8, 16, 512))
    d = runtime.Dispatcher({f.name: f for f in fakes}, records=store,
                           priorities={f.name: i for i, f in enumerate(fakes)})
    previous = runtime.set_dispatcher(d)
    yield d
    runtime.set_dispatcher(previous)


@pytest.fixture
def a_b(store: RecordStore) -> Iterator[tuple[Any, Fake, Fake]]:
    """Two verified fakes, ``a`` preferred, installed as the process-wide dispatcher."""
    a, b = Fake("a"), Fake("b")
    for d in _install(store, a, b):
        yield d, a, b


def _qkv(*, hq: int = 4, hkv: int = 2, sq: int = 8, sk: int = 8, d: int = 16,
         dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(11)
    return tuple(torch.randn(1, h, s, d, generator=g, dtype=dtype).to(device)
                 for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))


def _check(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
           scale: float | None = None) -> None:
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype))


def test_a_repeated_signature_is_decided_once(a_b: tuple[Any, Fake, Fake]) -> None:
    _, a, b = a_b
    q, k, v = _qkv()
    for _ in range(5):
        _check(attnforge.attention(q, k, v), q, k, v)
    assert (a.decided, b.decided, a.calls, b.calls) == (1, 1, 5, 0)


def test_a_backend_that_breaks_on_the_hot_path_falls_back_and_is_dropped(a_b: tuple[Any, Fake, Fake]) -> None:
    d, a, b = a_b
    q, k, v = _qkv()
    attnforge.attention(q, k, v, causal=True)
    a.raises = RuntimeError("illegal memory access")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attnforge.attention(q, k, v, causal=True)
        again = attnforge.attention(q, k, v, causal=True)
    assert [str(w.message).split(";")[0] for w in caught] == [
        "attnforge: attention backend 'a' raised RuntimeError: illegal memory access"]
    assert caught[0].filename == __file__  # the warning points at the caller of attention()
    _check(out, q, k, v, causal=True)
    _check(again, q, k, v, causal=True)
    assert (a.calls, b.calls) == (2, 2)
    assert "a" in d.demoted and d.broken == {}  # skipped for the signature, not the shape class


def test_use_backend_is_seen_by_a_remembered_signature(a_b: tuple[Any, Fake, Fake]) -> None:
    _, a, b = a_b
    q, k, v = _qkv()
    attnforge.attention(q, k, v)
    with attnforge.use_backend("b"):
        attnforge.attention(q, k, v)
    attnforge.attention(q, k, v)
    attnforge.attention(q, k, v, backend="b")
    assert (a.calls, b.calls) == (2, 2)


def test_use_backend_stays_per_thread_on_the_hot_path(a_b: tuple[Any, Fake, Fake]) -> None:
    _, a, b = a_b
    q, k, v = _qkv()
    attnforge.attention(q, k, v)  # the unforced route exists before the threads start
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def loop(forced: str | None) -> None:
        try:
            start.wait()
            for _ in range(200):
                if forced:
                    with attnforge.use_backend(forced):
                        attnforge.attention(q, k, v)
                else:
                    attnforge.attention(q, k, v)
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(name,)) for name in (None, "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert (a.calls, b.calls) == (201, 200)


def test_refresh_drops_remembered_signatures(store: RecordStore) -> None:
    a = Fake("a")
    for _ in _install(store, a, verified=()):
        q, k, v = _qkv()
        attnforge.attention(q, k, v)
        store.add_verify(VerifyRecord(device_key=CPU_KEY, backend="a", backend_version="1", ok=True,
                                      summary="ok"))
        attnforge.attention(q, k, v)
        assert a.calls == 0  # records are read once per process
        runtime.refresh()
        attnforge.attention(q, k, v)
        assert a.calls == 1


@pytest.mark.parametrize(("change", "served_by"), [
    pytest.param({"dtype": torch.float64}, "b", id="dtype"),
    pytest.param({"sq": 9}, "a", id="shape-same-bucket"),
    pytest.param({"sq": 300, "sk": 300}, "a", id="shape-other-bucket"),
    pytest.param({"hq": 2}, "a", id="heads"),
])
def test_another_signature_is_decided_on_its_own(store: RecordStore, change: dict[str, Any],
                                                 served_by: str) -> None:
    a, b = Fake("a", dtypes=(torch.float32,)), Fake("b")
    for _ in _install(store, a, b):
        q, k, v = _qkv()
        attnforge.attention(q, k, v)
        q2, k2, v2 = _qkv(**change)
        out = attnforge.attention(q2, k2, v2)
        _check(out, q2, k2, v2)
        assert out.dtype == q2.dtype
        assert {"a": a.calls, "b": b.calls}[served_by] == 1 + (served_by == "a")


@pytest.mark.parametrize(("mutate", "message"), [
    pytest.param(lambda q, k, v: (q, k, v[:, :, :5]), "k and v differ", id="kv-shape"),
    pytest.param(lambda q, k, v: (q, k.double(), v), "dtypes differ", id="dtype"),
    pytest.param(lambda q, k, v: (q, k.to("meta"), v), "different devices", id="device"),
    pytest.param(lambda q, k, v: (q[0], k, v), "3 dimensions", id="rank"),
    pytest.param(lambda q, k, v: (q.numpy(), k, v), "not a torch.Tensor", id="not-a-tensor"),
])
def test_bad_input_after_a_good_call_is_still_refused(a_b: tuple[Any, Fake, Fake], mutate: Any,
                                                      message: str) -> None:
    q, k, v = _qkv()
    attnforge.attention(q, k, v)
    with pytest.raises(DispatchError, match=message):
        attnforge.attention(*mutate(q, k, v))


@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan"), "0.5"])
def test_bad_scale_after_a_good_call_is_still_refused(a_b: tuple[Any, Fake, Fake], scale: Any) -> None:
    q, k, v = _qkv()
    attnforge.attention(q, k, v, scale=0.5)
    with pytest.raises(DispatchError, match="scale must be positive"):
        attnforge.attention(q, k, v, scale=scale)


def test_remembered_signatures_are_bounded(a_b: tuple[Any, Fake, Fake], monkeypatch: pytest.MonkeyPatch) -> None:
    d, a, _ = a_b
    monkeypatch.setattr(dispatcher_module, "ROUTES_MAX", 2)
    for sq in (3, 5, 6, 7):
        q, k, v = _qkv(sq=sq)
        _check(attnforge.attention(q, k, v), q, k, v)
        assert len(d.routes) <= 2
    assert a.calls == 4


def test_a_route_decided_across_a_refresh_is_not_remembered(store: RecordStore) -> None:
    a = Fake("a")
    for d in _install(store, a):
        def decide_then_refresh(call: AttentionCall, dispatcher: Any = d) -> list[str]:
            dispatcher.refresh()  # records change while this call is being decided
            return []

        a.unsupported_reasons = decide_then_refresh  # type: ignore[method-assign]
        q, k, v = _qkv()
        _check(attnforge.attention(q, k, v), q, k, v)
        assert d.routes == {}
        assert d._plans == {}


# -- layouts --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_bshd_inputs_reach_a_bshd_kernel_untouched(store: RecordStore, causal: bool) -> None:
    native = FakeBshd("native")
    for _ in _install(store, native):
        q, k, v = (t.transpose(1, 2).contiguous() for t in _qkv(sq=5, sk=8))  # [B, S, H, D]
        out = attnforge.attention(q, k, v, layout="bshd", causal=causal)
        assert all(got is given for got, given in zip(native.received, (q, k, v), strict=True))
        assert out.shape == q.shape
        _check(out.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)


def test_bshd_inputs_to_a_bhsd_kernel_are_transposed_views(a_b: tuple[Any, Fake, Fake]) -> None:
    q, k, v = (t.transpose(1, 2).contiguous() for t in _qkv())
    out = attnforge.attention(q, k, v, layout="bshd")
    assert out.shape == q.shape
    _check(out.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


def test_a_broken_bshd_kernel_falls_back_to_sdpa_in_the_callers_layout(store: RecordStore) -> None:
    native = FakeBshd("native", raises=RuntimeError("no kernel image"))
    for _ in _install(store, native):
        q, k, v = (t.transpose(1, 2).contiguous() for t in _qkv())
        with pytest.warns(RuntimeWarning, match="'native' raised"):
            out = attnforge.attention(q, k, v, layout="bshd")
        _check(out.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


# -- the kernel adapters' two entries, over stand-in kernel modules -----------------------------------
def _ref_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              scale: float | None) -> torch.Tensor:
    t = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return reference_attention(*t, causal=causal, scale=scale).transpose(1, 2).to(q.dtype)


def _flash_module(seen: list[tuple[torch.Tensor, ...]]) -> types.ModuleType:
    module = types.ModuleType("fake_flash_attn")

    def flash_attn_func(q: Any, k: Any, v: Any, *, softmax_scale: Any = None, causal: bool = False) -> Any:
        seen.append((q, k, v))
        return _ref_bshd(q, k, v, causal=causal, scale=softmax_scale), None  # (out, lse) as FA3/FA4

    module.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    return module


def _adapter(cls: type, name: str, module: str) -> Any:
    caps = registry.adapters()[name].caps  # type: ignore[attr-defined]
    caps = dataclasses.replace(caps, devices=("cpu",), support=dataclasses.replace(
        caps.support, min_cc=ComputeCapability(0, 0), dtypes=("float32",)))
    return cls(name=name, caps=caps, requirement=Requirement(modules=(module,)))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_adapter_entries(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    seen: list[tuple[torch.Tensor, ...]] = []
    monkeypatch.setitem(sys.modules, "fake_flash_attn", _flash_module(seen))
    fa = _adapter(FlashAttnAdapter, "flash-attn-4", "fake_flash_attn")
    q, k, v = _qkv(sq=5, sk=8)
    _check(fa(q, k, v, causal=causal, scale=0.3), q, k, v, causal=causal, scale=0.3)
    assert [t.shape[1] for t in seen[-1]] == [5, 8, 8]  # the kernel got [B, S, H, D] views
    assert all(t.data_ptr() == s.data_ptr() for t, s in zip(seen[-1], (q, k, v), strict=True))  # no copies
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    torch.testing.assert_close(fa.call_bshd(qs, ks, vs, causal=causal, scale=0.3),
                               _ref_bshd(qs, ks, vs, causal=causal, scale=0.3))
    assert seen[-1][0] is qs


def test_flash_attn_adapter_through_attention_in_both_layouts(store: RecordStore,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[torch.Tensor, ...]] = []
    monkeypatch.setitem(sys.modules, "fake_flash_attn", _flash_module(seen))
    fa = _adapter(FlashAttnAdapter, "flash-attn-4", "fake_flash_attn")
    for _ in _install(store, fa):  # type: ignore[arg-type]
        q, k, v = _qkv()
        _check(attnforge.attention(q, k, v, causal=True), q, k, v, causal=True)
        qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        out = attnforge.attention(qs, ks, vs, causal=True, layout="bshd")
        assert seen[-1][0] is qs
        torch.testing.assert_close(out, _ref_bshd(qs, ks, vs, causal=True, scale=None))


def _xformers_modules(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> None:
    class LowerTriangularMask:
        pass

    class LowerTriangularFromBottomRightMask:
        pass

    def memory_efficient_attention(q: Any, k: Any, v: Any, *, attn_bias: Any = None, scale: Any = None) -> Any:
        assert q.shape[2] == k.shape[2] == v.shape[2]  # heads expanded: BMHK without GQA
        seen.append(attn_bias)
        return _ref_bshd(q, k, v, causal=attn_bias is not None, scale=scale)

    ops = types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = memory_efficient_attention  # type: ignore[attr-defined]
    fmha = types.ModuleType("xformers.ops.fmha")
    fmha.attn_bias = types.SimpleNamespace(  # type: ignore[attr-defined]
        LowerTriangularMask=LowerTriangularMask,
        LowerTriangularFromBottomRightMask=LowerTriangularFromBottomRightMask)
    for name, module in (("xformers", types.ModuleType("xformers")), ("xformers.ops", ops),
                         ("xformers.ops.fmha", fmha)):
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize(("sq", "sk", "bias"), [
    pytest.param(6, 6, "LowerTriangularMask", id="square"),
    pytest.param(5, 8, "LowerTriangularFromBottomRightMask", id="sq<sk"),
])
def test_xformers_adapter_entries(monkeypatch: pytest.MonkeyPatch, sq: int, sk: int, bias: str) -> None:
    seen: list[Any] = []
    _xformers_modules(monkeypatch, seen)
    xf = _adapter(XformersAdapter, "xformers", "xformers.ops")
    q, k, v = _qkv(sq=sq, sk=sk)  # GQA: Hq = 4, Hkv = 2
    _check(xf(q, k, v, causal=True, scale=None), q, k, v, causal=True)
    assert type(seen[-1]).__name__ == bias
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    torch.testing.assert_close(xf.call_bshd(qs, ks, vs, causal=False, scale=0.5),
                               _ref_bshd(qs, ks, vs, causal=False, scale=0.5))


@pytest.mark.parametrize(("entry", "tensor_layout"), [("__call__", "HND"), ("call_bshd", "NHD")])
def test_sage_adapter_entries_name_their_layout(monkeypatch: pytest.MonkeyPatch, entry: str,
                                                tensor_layout: str) -> None:
    seen: list[str] = []

    def sageattn(q: Any, k: Any, v: Any, *, tensor_layout: str, is_causal: bool, sm_scale: Any) -> Any:
        seen.append(tensor_layout)
        return q

    module = types.ModuleType("fake_sageattention")
    module.sageattn = sageattn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_sageattention", module)
    sage = SageAdapter(name="sageattention-2", caps=registry.adapters()["sageattention-2"].caps,  # type: ignore[attr-defined]
                       requirement=Requirement(modules=("fake_sageattention",)))
    q, k, v = _qkv()
    assert getattr(sage, entry)(q, k, v, causal=False, scale=None) is q
    assert seen == [tensor_layout]


def test_the_package_attribute_is_held_but_a_patched_stand_in_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(vars(attnforge), "attention", raising=False)
    assert attnforge.attention is runtime.attention
    assert vars(attnforge)["attention"] is runtime.attention  # no __getattr__ on the next call
    monkeypatch.delitem(vars(attnforge), "attention")

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        return None

    monkeypatch.setattr(runtime, "attention", stand_in)
    assert attnforge.attention is stand_in
    assert "attention" not in vars(attnforge)


# -- routes bound to the signature ---------------------------------------------------------------------------
@pytest.mark.parametrize(("causal", "shape", "bound"), [
    pytest.param(False, {"sq": 8, "sk": 8, "hq": 4, "hkv": 4}, True, id="plain"),
    pytest.param(True, {"sq": 8, "sk": 8, "hq": 4, "hkv": 4}, True, id="causal-square"),
    pytest.param(False, {"sq": 5, "sk": 8, "hq": 4, "hkv": 2}, True, id="gqa-native"),
    pytest.param(True, {"sq": 5, "sk": 8, "hq": 4, "hkv": 2}, False, id="causal-bottom-right-needs-the-adapters-mask"),
])
def test_sdpa_binds_the_plain_call_to_sdpa_itself(causal: bool, shape: dict[str, int], bound: bool) -> None:
    sdpa = registry.fallback()
    q, k, v = _qkv(**shape)
    call = runtime.get_dispatcher().describe(q, k, causal=causal, precision="exact", needs_grad=False)
    fn = sdpa.bind(call, scale=0.3, bshd=False)  # type: ignore[attr-defined]
    assert (fn is not None) == bound
    if fn is not None:
        torch.testing.assert_close(fn(q, k, v), sdpa(q, k, v, causal=causal, scale=0.3))
    on_bshd = sdpa.bind(call, scale=0.3, bshd=True)  # type: ignore[attr-defined]
    assert (on_bshd is not None) == bound
    if on_bshd is not None:  # [B, S, H, D] tensors: the same call on their views, the output a view back
        qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        out = on_bshd(qs, ks, vs)
        assert out.shape == (*qs.shape[:3], v.shape[-1])
        torch.testing.assert_close(out.transpose(1, 2), sdpa(q, k, v, causal=causal, scale=0.3))
    assert registry.adapters()["sdpa-math"].bind(call, scale=None, bshd=False) is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("scale", [None, 0.25])
def test_the_scale_is_part_of_the_signature(store: RecordStore, scale: float | None) -> None:
    a = Fake("a")
    for d in _install(store, a):
        q, k, v = _qkv()
        _check(attnforge.attention(q, k, v), q, k, v)
        _check(attnforge.attention(q, k, v, scale=scale), q, k, v, scale=scale)
        assert len(d.routes) == (1 if scale is None else 2)


@dataclasses.dataclass
class BindRaises(Fake):
    """A backend whose ``bind`` raises (its module fails to import): the generic call is kept and its error at
    run time marks the backend broken."""

    def bind(self, call: AttentionCall, *, scale: float | None, bshd: bool) -> Any:
        raise ImportError("no module named 'kernels'")


def test_a_bind_that_raises_leaves_the_generic_call(store: RecordStore) -> None:
    broken = BindRaises("b", raises=ImportError("no module named 'kernels'"))
    for d in _install(store, broken):
        q, k, v = _qkv()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _check(attnforge.attention(q, k, v), q, k, v)
        assert broken.calls == 1 and "b" in d.demoted and len(caught) == 1


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_sdpa_style_defaults_keep_a_call_on_the_plain_path(a_b: tuple[Any, Fake, Fake], layout: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers' backend and ``patch_sdpa`` pass SDPA's defaults on every call: top-left alignment without causal,
    ``enable_gqa=False`` with equal heads. Neither changes the call, so it stays on the plain path, its route
    remembered (a feature route is bound per call: FlashAttention-4's replay was recorded anew on every call)."""
    from attnforge.dispatch import features

    _, a, _ = a_b
    took = count_calls(monkeypatch, features, "attention")
    q, k, v = _qkv(hq=2, hkv=2)
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    for _ in range(3):
        out = attnforge.attention(q, k, v, causal=False, causal_alignment="top_left", enable_gqa=False,
                                  dropout_p=0.0, return_lse=False, layout=layout)
    as_bhsd = [t.transpose(1, 2) if layout == "bshd" else t for t in (q, k, v, out)]
    _check(as_bhsd[3], *as_bhsd[:3])
    assert took == [] and a.decided == 1 and a.calls == 3
    q, k, v = _qkv(hq=4, hkv=2)
    with pytest.raises(DispatchError):  # enable_gqa=False still refuses Hq != Hkv, as SDPA does
        attnforge.attention(q, k, v, enable_gqa=False)
    attnforge.attention(q, k, v, causal=True, causal_alignment="top_left")  # Sq == Sk: it aligns nothing
    assert took == [1]
    q, k, v = _qkv(hq=4, hkv=2, sq=4, sk=8)
    attnforge.attention(q, k, v, causal=True, causal_alignment="top_left")  # causal, Sq != Sk: the feature path
    assert took == [1, 1]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_sdpas_is_causal_spelling_keeps_a_call_on_the_plain_path_where_it_means_causal(
        a_b: tuple[Any, Fake, Fake], layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drop-in for ``F.scaled_dot_product_attention`` passes ``is_causal``: ``False`` asks for nothing, and ``True``
    with Sq == Sk is causal in either alignment, so both stay on the plain path with the answers of ``causal=False``
    / ``causal=True`` (one route each, remembered). With Sq != Sk top-left differs from bottom-right: the feature
    path serves it, top-left as SDPA aligns it; ``causal=True`` with ``is_causal=False`` still disagrees."""
    from attnforge.dispatch import features

    _, a, _ = a_b
    took = count_calls(monkeypatch, features, "attention")

    def laid(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.transpose(1, 2).contiguous() for t in ts) if layout == "bshd" else ts

    def back(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2) if layout == "bshd" else t

    q, k, v = _qkv(hq=2, hkv=2)
    for flag in (True, False):
        for _ in range(3):
            out = attnforge.attention(*laid(q, k, v), is_causal=flag, layout=layout)
            _check(back(out), q, k, v, causal=flag)
    # a window: the feature path (twice), where with Sq == Sk top-left answers as bottom-right
    out = attnforge.attention(*laid(q, k, v), causal=True, causal_alignment="top_left", window=(3, 0), layout=layout)
    want = attnforge.attention(*laid(q, k, v), causal=True, window=(3, 0), layout=layout)
    torch.testing.assert_close(out, want)
    assert took == [1, 1]
    out = attnforge.attention(*laid(q, k, v), causal=True, causal_alignment="top_left", layout=layout)
    _check(back(out), q, k, v, causal=True)
    assert took == [1, 1] and a.calls == 7  # top-left causal with Sq == Sk: the plain path, as causal=True
    q, k, v = _qkv(hq=2, hkv=2, sq=4, sk=8)
    out = attnforge.attention(*laid(q, k, v), is_causal=True, layout=layout)
    top_left = torch.ones(4, 8, dtype=torch.bool).tril()
    torch.testing.assert_close(back(out), reference_attention(q, k, v, attn_mask=top_left).to(q.dtype))
    assert took == [1, 1, 1]
    with pytest.raises(DispatchError, match="disagree"):
        attnforge.attention(*laid(q, k, v), causal=True, is_causal=False, layout=layout)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_flashattentions_defaults_keep_a_call_on_the_plain_path(a_b: tuple[Any, Fake, Fake], layout: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller translating FlashAttention's keywords passes ``window=(-1, -1)`` (unbounded: it hides no key) and
    ``softcap=0.0`` (off) on every call: both stay on the plain path with plain causal's answers. A window that
    hides keys or a softcap that caps goes down the feature path, and what validation refuses is still refused
    (a float window side, a negative softcap), with the feature path's error, never a traceback of the check."""
    from attnforge.dispatch import features

    _, a, _ = a_b
    took = count_calls(monkeypatch, features, "attention")

    def laid(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.transpose(1, 2).contiguous() for t in ts) if layout == "bshd" else ts

    q, k, v = _qkv(hq=2, hkv=2)
    for window, softcap in (((-1, -1), 0.0), ((None, None), 0), ([-1, None], None), (None, 0.0)):
        out = attnforge.attention(*laid(q, k, v), causal=True, window=window, softcap=softcap, layout=layout)
        _check(out.transpose(1, 2) if layout == "bshd" else out, q, k, v, causal=True)
    assert took == [] and a.calls == 4
    attnforge.attention(*laid(q, k, v), causal=True, window=(2, -1), layout=layout)  # it hides keys
    attnforge.attention(*laid(q, k, v), softcap=30.0, layout=layout)
    assert took == [1, 1]
    for bad in ({"window": (-1.0, -1)}, {"softcap": -1.0}, {"window": (-1, -1, -1)}):
        with pytest.raises(DispatchError):
            attnforge.attention(*laid(q, k, v), layout=layout, **bad)  # type: ignore[arg-type]

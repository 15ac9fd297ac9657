"""attention(): numerics against the float64 reference, selection, fallback, forcing, explain."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnforge
from attnforge.backends import registry
from attnforge.backends.adapter import AttentionCall
from attnforge.backends.exact import reference_attention
from attnforge.dispatch import runtime
from attnforge.errors import DispatchError
from attnforge.records import BenchRecord, RecordStore, VerifyRecord, device_key
from tests.dispatch._measured import record_faster

CPU_KEY = device_key("cpu", None, torch.__version__)


@pytest.fixture
def store(tmp_path: Path) -> RecordStore:
    return RecordStore(tmp_path / "home")


@pytest.fixture
def default_dispatcher(store: RecordStore) -> Any:
    """The real registry over an empty record store, installed as the process-wide dispatcher."""
    previous = runtime.set_dispatcher(runtime.Dispatcher(records=store))
    yield runtime.get_dispatcher()
    runtime.set_dispatcher(previous)


@dataclass
class FakeAdapter:
    """A backend at the seam: serves with the reference math (or raises), records its calls."""

    name: str
    raises: Exception | None = None
    reasons: list[str] = field(default_factory=list)
    calls: int = 0

    def load_error(self) -> str | None:
        return None

    def unsupported_reasons(self, call: AttentionCall) -> list[str]:
        return list(self.reasons)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        self.calls += 1
        if self.raises is not None:
            raise self.raises
        return reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype)


def _verify(store: RecordStore, *names: str, ok: bool = True) -> None:
    for name in names:
        store.add_verify(VerifyRecord(device_key=CPU_KEY, backend=name, backend_version="1", ok=ok,
                                      summary="3 cases passed" if ok else "max abs err 0.3 > 0.02"))


def _qkv(*, b: int = 1, hq: int = 4, hkv: int = 2, sq: int = 8, sk: int = 8, d: int = 16,
         dtype: torch.dtype = torch.float32, grad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    return tuple(torch.randn(b, h, s, d, generator=g, dtype=dtype).requires_grad_(grad)
                 for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))


# -- numerics -------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 3), groups=st.integers(1, 3), sq=st.integers(1, 17),
       sk=st.integers(1, 17), d=st.sampled_from([1, 8, 13, 32]), causal=st.booleans(),
       layout=st.sampled_from(["bhsd", "bshd"]), scale=st.none() | st.floats(0.05, 2.0),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_attention_matches_float64_reference(  # noqa: PLR0917 - hypothesis draws
        b: int, hkv: int, groups: int, sq: int, sk: int, d: int,
                                             causal: bool, layout: str, scale: float | None,
                                             dtype: torch.dtype) -> None:
    q, k, v = _qkv(b=b, hq=hkv * groups, hkv=hkv, sq=sq, sk=sk, d=d, dtype=dtype, grad=True)
    as_layout = (lambda t: t.transpose(1, 2).contiguous()) if layout == "bshd" else (lambda t: t)
    qi, ki, vi = (as_layout(t.detach()).requires_grad_() for t in (q, k, v))
    out = attnforge.attention(qi, ki, vi, causal=causal, scale=scale, layout=layout)
    out_bhsd = out.transpose(1, 2) if layout == "bshd" else out
    ref = reference_attention(q, k, v, causal=causal, scale=scale)
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-9}
    assert out.dtype == dtype
    assert out.shape == (as_layout(q).shape)
    torch.testing.assert_close(out_bhsd.double(), ref, **tol)
    weights = torch.randn_like(ref)
    grads = torch.autograd.grad((out_bhsd.double() * weights).sum(), (qi, ki, vi))
    ref_grads = torch.autograd.grad((ref * weights).sum(), (q, k, v))
    # float32 gradients sum Sq rounding errors (a K/V gradient that is exactly 0 with one key comes out ~1e-5)
    grad_tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else tol
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.transpose(1, 2) if layout == "bshd" else got, want.to(dtype), **grad_tol)


@pytest.mark.parametrize(("change", "message"), [
    pytest.param({"layout": "bsdh"}, "unknown layout", id="layout"),
    pytest.param({"precision": "fp8"}, "unknown precision", id="precision"),
    pytest.param({"hq": 3}, "not a multiple", id="gqa"),
    pytest.param({"k_seq": 5}, "k and v differ", id="kv-shape"),
    pytest.param({"d": 8}, "head dim", id="head-dim"),
    pytest.param({"dims": 3}, "3 dimensions", id="rank"),
    pytest.param({"scale": -1.0}, "scale must be positive", id="scale"),
    pytest.param({"int": True}, "floating-point", id="dtype"),
])
def test_bad_input_raises_dispatch_error(change: dict[str, Any], message: str) -> None:
    q = torch.randn(1, change.get("hq", 4), 8, change.get("d", 16))
    k = torch.randn(1, 2, 8, 16)
    v = torch.randn(1, 2, change.get("k_seq", 8), 16)
    if change.get("dims") == 3:
        q = q[0]
    if change.get("int"):
        q, k, v = q.long(), k.long(), v.long()
    with pytest.raises(DispatchError, match=message) as info:
        attnforge.attention(q, k, v, layout=change.get("layout", "bhsd"),
                            precision=change.get("precision", "exact"), scale=change.get("scale"))
    assert info.value.exit_code == 2


# -- selection ------------------------------------------------------------------------------------------
def _dispatcher(store: RecordStore, *fakes: FakeAdapter, priorities: dict[str, int] | None = None) -> Any:
    return runtime.Dispatcher({f.name: f for f in fakes}, records=store,
                              priorities=priorities or {f.name: i for i, f in enumerate(fakes)})


def test_only_verified_backends_are_chosen_and_sdpa_closes_the_order(store: RecordStore) -> None:
    fast, unverified, failed = FakeAdapter("fast"), FakeAdapter("unverified"), FakeAdapter("failed")
    _verify(store, "fast")
    _verify(store, "failed", ok=False)
    d = _dispatcher(store, unverified, failed, fast)
    q, k, v = _qkv()
    record_faster(store, ["unverified", "failed", "fast"], q, k)  # measured fastest, but not verified
    exp = d.explain(q, k, causal=False, precision="exact", needs_grad=False, backend=None)
    assert exp.order == ("fast", "sdpa")
    rejected = {r.backend: r.reasons for r in exp.rejected}
    assert "not verified on this device (run: attnforge verify unverified)" in rejected["unverified"]
    assert "verify failed: max abs err 0.3 > 0.02" in rejected["failed"]
    d.run(q, k, v, causal=False, scale=None, backend=None, precision="exact", needs_grad=False)
    assert (fast.calls, unverified.calls, failed.calls) == (1, 0, 0)


def _bench(backend: str, tflops: float, *, seqlen: int = 8, mode: str = "fwd") -> BenchRecord:
    return BenchRecord(device_key=CPU_KEY, backend=backend, backend_version="1", dtype="float32", mode=mode,
                       causal=False, batch=1, heads_q=4, heads_kv=2, head_dim=16, seqlen_q=seqlen,
                       seqlen_k=seqlen, ms=1.0, tflops=tflops, peak_mem_bytes=None, run_id="r1")


@pytest.mark.parametrize(("bench", "expected"), [
    pytest.param([], ("sdpa", "a", "b"), id="unmeasured-never-before-sdpa"),
    pytest.param([_bench("b", 50.0), _bench("a", 10.0)], ("b", "a", "sdpa"), id="measured-speed-wins"),
    pytest.param([_bench("b", 50.0)], ("b", "sdpa", "a"), id="measured-before-sdpa-before-unmeasured"),
    pytest.param([_bench("sdpa", 90.0), _bench("a", 10.0)], ("sdpa", "a", "b"), id="sdpa-measured-fastest"),
    pytest.param([_bench("b", 50.0, seqlen=4096)], ("sdpa", "a", "b"), id="other-shape-class-ignored"),
    pytest.param([_bench("b", 50.0, mode="fwd+bwd")], ("sdpa", "a", "b"), id="other-mode-ignored"),
    pytest.param([_bench("sdpa", 1.0, seqlen=4), _bench("b", 5.0, seqlen=4), _bench("sdpa", 1.0, seqlen=16),
                  _bench("b", 5.0, seqlen=16)], ("b", "sdpa", "a"), id="won-on-both-sides-leads"),
    pytest.param([_bench("sdpa", 1.0, seqlen=4), _bench("b", 5.0, seqlen=4), _bench("sdpa", 9.0, seqlen=16),
                  _bench("b", 5.0, seqlen=16)], ("sdpa", "a", "b"), id="lost-on-one-side-follows-sdpa"),
    pytest.param([_bench("sdpa", 1.0, seqlen=32), _bench("b", 5.0, seqlen=32), _bench("sdpa", 1.0, seqlen=64),
                  _bench("b", 5.0, seqlen=64)], ("sdpa", "a", "b"), id="never-extrapolated"),
])
def test_order_follows_bench_and_unmeasured_never_precedes_sdpa(store: RecordStore, bench: list[BenchRecord],
                                                                 expected: tuple[str, ...]) -> None:
    _verify(store, "a", "b")
    store.add_bench(bench) if bench else None
    d = _dispatcher(store, FakeAdapter("a"), FakeAdapter("b"))
    q, k, _ = _qkv(sq=7, sk=5)  # bucket 8: same class as the records of seqlen 8
    assert d.explain(q, k, causal=False, precision="exact", needs_grad=False, backend=None).order == expected


def test_a_backend_that_raises_is_marked_broken_warned_once_and_never_used_again(store: RecordStore) -> None:
    bad, good = FakeAdapter("bad", raises=RuntimeError("no kernel image is available")), FakeAdapter("good")
    _verify(store, "bad", "good")
    d = _dispatcher(store, bad, good)
    q, k, v = _qkv()
    record_faster(store, ["bad", "good"], q, k, causal=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = d.run(q, k, v, causal=True, scale=None, backend=None, precision="exact", needs_grad=False)
        again = d.run(q, k, v, causal=True, scale=None, backend=None, precision="exact", needs_grad=False)
    assert [str(w.message).split(";")[0] for w in caught] == [
        "attnforge: attention backend 'bad' raised RuntimeError: no kernel image is available"]
    assert caught[0].category is RuntimeWarning
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=True, scale=None).float())
    torch.testing.assert_close(again, out)
    assert (bad.calls, good.calls) == (1, 2)
    exp = d.explain(q, k, causal=True, precision="exact", needs_grad=False, backend=None)
    assert exp.chosen == "good"
    assert any("raised on this call signature" in r for rej in exp.rejected if rej.backend == "bad"
               for r in rej.reasons)
    assert exp.notes == ("bad raised on this signature: RuntimeError: no kernel image is available; served by good",)
    assert "note: bad raised on this signature" in str(exp) and "forced" not in str(exp)


@dataclass
class _CompileCacheMiss(FakeAdapter):
    """A backend whose compile lookup opens ``lock`` (FlashAttention-4's cache: a lock file in a folder it made once,
    at import): FileNotFoundError while that folder is missing, as FA4 raised on an H200 on 2026-12-01."""

    lock: Path = Path()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 scale: float | None) -> torch.Tensor:
        if not self.lock.parent.is_dir():
            self.calls += 1
            raise FileNotFoundError(2, "No such file or directory", str(self.lock))
        return super().__call__(q, k, v, causal=causal, scale=scale)


@pytest.mark.parametrize("inside", [True, False], ids=["cache-folder", "elsewhere"])
def test_a_compile_cache_folder_removed_while_running_is_made_again_and_the_call_served(
        store: RecordStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: bool) -> None:
    """The chosen backend misses a file of its compile cache because the folder was removed while the process ran
    (a cleaned cache; FA4 makes its folders once, at import): the folder is made again and the same backend serves
    the call, with no warning and nothing skipped. A missing file anywhere else is a backend failure as before: the
    next backend serves, the folder is not made."""
    cache = tmp_path / "compile" / "flash-attn-cute"
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(cache))
    lock = (cache if inside else tmp_path / "elsewhere") / "3f2a" / "fwd" / "9c1d.lock"
    miss, good = _CompileCacheMiss("miss", lock=lock), FakeAdapter("good")
    _verify(store, "miss", "good")
    d = _dispatcher(store, miss, good)
    q, k, v = _qkv()
    record_faster(store, ["miss", "good"], q, k, causal=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = d.run(q, k, v, causal=True, scale=None, backend=None, precision="exact", needs_grad=False)
        again = d.run(q, k, v, causal=True, scale=None, backend=None, precision="exact", needs_grad=False)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=True, scale=None).float())
    torch.testing.assert_close(again, out)
    chosen = d.explain(q, k, causal=True, precision="exact", needs_grad=False, backend=None).chosen
    if inside:
        assert lock.parent.is_dir()
        assert (miss.calls, good.calls) == (3, 0) and chosen == "miss" and caught == []
    else:
        assert not lock.parent.exists()
        assert (miss.calls, good.calls) == (1, 2) and chosen == "good"
        assert [str(w.message).split(";")[0] for w in caught] == [
            "attnforge: attention backend 'miss' raised FileNotFoundError: [Errno 2] No such file or directory: "
            f"'{lock}'"]


def test_records_are_read_once_until_refresh(store: RecordStore) -> None:
    a = FakeAdapter("a")
    d = _dispatcher(store, a)
    q, k, _ = _qkv()
    record_faster(store, ["a"], q, k)
    assert d.explain(q, k, causal=False, precision="exact", needs_grad=False, backend=None).chosen == "sdpa"
    _verify(store, "a")
    assert d.explain(q, k, causal=False, precision="exact", needs_grad=False, backend=None).chosen == "sdpa"
    d.refresh()
    assert d.explain(q, k, causal=False, precision="exact", needs_grad=False, backend=None).chosen == "a"


# -- forcing --------------------------------------------------------------------------------------------
def test_use_backend_forces_and_restores(default_dispatcher: Any) -> None:
    q, k, v = _qkv(dtype=torch.float64)
    with attnforge.use_backend("sdpa-math"):
        exp = attnforge.explain(q, k, v)
        out = attnforge.attention(q, k, v)
    assert exp.forced
    assert exp.chosen == "sdpa-math"
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=False, scale=None))
    assert not attnforge.explain(q, k, v).forced


def test_use_backend_unknown_name_lists_known_ones(default_dispatcher: Any) -> None:
    with pytest.raises(DispatchError, match="unknown attention backend 'flash-atn'") as info:  # noqa: SIM117
        with attnforge.use_backend("flash-atn"):
            pass
    assert info.value.hint is not None
    assert "flash-attn" in info.value.hint
    assert "sdpa-math" in info.value.hint


def test_forced_backend_that_cannot_serve_raises_with_its_reasons(default_dispatcher: Any) -> None:
    q, k, v = _qkv()
    with attnforge.use_backend("flash-attn"), pytest.raises(DispatchError) as info:
        attnforge.attention(q, k, v)
    assert "cannot serve" in info.value.message
    assert info.value.cause is not None
    assert "runs on cuda, the tensors are on cpu" in info.value.cause
    exp = attnforge.explain(q, k, v, backend="flash-attn")
    assert exp.chosen is None
    assert "forced backend cannot serve" in str(exp)


def test_use_backend_is_per_thread(default_dispatcher: Any) -> None:
    q, k, v = _qkv(dtype=torch.float64)
    seen: dict[str, str | None] = {}
    entered, done = threading.Event(), threading.Event()

    def other() -> None:
        entered.wait()
        seen["other"] = attnforge.explain(q, k, v).chosen
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with attnforge.use_backend("sdpa-math"):
        entered.set()
        done.wait()
        seen["main"] = attnforge.explain(q, k, v).chosen
    thread.join()
    assert seen == {"main": "sdpa-math", "other": "sdpa"}


def test_explain_names_every_backend(default_dispatcher: Any) -> None:
    q, k, v = _qkv(sq=9, sk=4)
    exp = attnforge.explain(q, k, v, causal=True)
    assert exp.chosen == "sdpa"
    assert {r.backend for r in exp.rejected} == set(registry.adapters())
    text = str(exp)
    assert "Sq=9 Sk=4" in text
    assert "chosen  sdpa" in text
    assert "sdpa-flash: " in text
    with pytest.raises(AttributeError):
        exp.chosen = "x"  # type: ignore[misc]

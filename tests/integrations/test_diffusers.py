"""The diffusers backend and processor against diffusers' defaults, in tiny random models (fp32, CPU, no
download): Flux and Wan through ``set_attention_backend("attnforge")`` and the processor, a UNet through the
processor; the processor's logic also against a minimal stand-in module (runs without diffusers)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import attnforge
from attnforge.integrations.diffusers import AttnforgeProcessor

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(autouse=True)
def _keep_active_backend() -> Any:
    """``set_attention_backend`` also sets diffusers' process-wide active backend; put it back."""
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry as registry
    except ImportError:
        yield
        return
    active = registry._active_backend
    yield
    registry._active_backend = active


def _standin(heads: int = 2, dim: int = 16) -> Any:
    """The attributes of diffusers' Attention that a processor reads, with plain Linear layers."""
    torch.manual_seed(0)
    lin = lambda: torch.nn.Linear(dim, dim)  # noqa: E731
    return SimpleNamespace(spatial_norm=None, group_norm=None, norm_cross=None, norm_q=None, norm_k=None,
                           heads=heads, scale=(dim // heads) ** -0.5, to_q=lin(), to_k=lin(), to_v=lin(),
                           to_out=[lin(), torch.nn.Identity()], residual_connection=True,
                           rescale_output_factor=2.0)


def test_processor_logic_matches_hand_written_attention() -> None:
    attn = _standin()
    x = torch.randn(2, 5, 16)
    ctx = torch.randn(2, 7, 16)
    b, h, d = 2, 2, 8
    q = attn.to_q(x).view(b, -1, h, d).transpose(1, 2)
    k = attn.to_k(ctx).view(b, -1, h, d).transpose(1, 2)
    v = attn.to_v(ctx).view(b, -1, h, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, h * d)
    want = (attn.to_out[0](o) + x) / 2.0
    with torch.no_grad():
        got = AttnforgeProcessor()(attn, x, encoder_hidden_states=ctx)
        want = want.detach()
    torch.testing.assert_close(got, want)


diffusers = pytest.importorskip("diffusers")
from attnforge.integrations import diffusers as df_integration  # noqa: E402


def test_matches_attn_processor_2_0_in_a_real_attention_with_a_padding_mask(served: list[Any]) -> None:
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=32, heads=4, dim_head=8, cross_attention_dim=24, residual_connection=True,
                     rescale_output_factor=1.5).eval()
    x, ctx = torch.randn(2, 6, 32), torch.randn(2, 9, 24)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 4:] = False
    outs = {}
    with torch.no_grad():
        for name, processor in (("default", AttnProcessor2_0()), ("attnforge", AttnforgeProcessor())):
            attn.set_processor(processor)
            outs[name] = (attn(x, encoder_hidden_states=ctx), attn(x, encoder_hidden_states=ctx, attention_mask=mask))
    torch.testing.assert_close(outs["attnforge"][0], outs["default"][0], **TOL)
    torch.testing.assert_close(outs["attnforge"][1], outs["default"][1], **TOL)
    assert len(served) == 2


def _flux() -> tuple[Any, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8)).eval()
    img_ids = torch.zeros(16, 3)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(16) // 4, torch.arange(16) % 4
    inputs = {"hidden_states": torch.randn(2, 16, 4), "encoder_hidden_states": torch.randn(2, 5, 32),
              "pooled_projections": torch.randn(2, 32), "timestep": torch.tensor([0.5, 0.7]),
              "img_ids": img_ids, "txt_ids": torch.zeros(5, 3)}
    return model, inputs


def _wan() -> tuple[Any, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32).eval()
    inputs = {"hidden_states": torch.randn(1, 4, 2, 4, 4), "timestep": torch.tensor([3]),
              "encoder_hidden_states": torch.randn(1, 5, 16)}
    return model, inputs


def _ltx() -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(0)
    model = diffusers.LTXVideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, num_layers=1, caption_channels=16).eval()
    text_mask = torch.ones(1, 5)
    text_mask[0, 4:] = 0
    inputs = {"hidden_states": torch.randn(1, 2 * 4 * 4, 4), "encoder_hidden_states": torch.randn(1, 5, 16),
              "timestep": torch.tensor([3]), "encoder_attention_mask": text_mask, "num_frames": 2, "height": 4,
              "width": 4}
    return model, inputs


def _hunyuan_video() -> tuple[Any, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16,
        pooled_projection_dim=8, rope_axes_dim=(2, 2, 4)).eval()
    text_mask = torch.ones(1, 5)
    text_mask[0, 4:] = 0
    inputs = {"hidden_states": torch.randn(1, 4, 2, 4, 4), "timestep": torch.tensor([3]),
              "encoder_hidden_states": torch.randn(1, 5, 16), "encoder_attention_mask": text_mask,
              "pooled_projections": torch.randn(1, 8), "guidance": torch.tensor([3.0])}
    return model, inputs


def _unet() -> tuple[Any, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32).eval()
    inputs = {"sample": torch.randn(2, 4, 8, 8), "timestep": torch.tensor([3, 5]),
              "encoder_hidden_states": torch.randn(2, 5, 32)}
    return model, inputs


@pytest.mark.parametrize("build", [_flux, _wan, _ltx, _hunyuan_video], ids=["flux", "wan", "ltx", "hunyuan-video"])
def test_set_attention_backend_matches_the_default(build: Any, served: list[Any]) -> None:
    df_integration.register()
    model, inputs = build()
    with torch.no_grad():
        want = model(**inputs).sample
        model.set_attention_backend("attnforge")
        got = model(**inputs).sample
        model.reset_attention_backend()
    torch.testing.assert_close(got, want, **TOL)
    assert served


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch internals imported by dynamo
@pytest.mark.parametrize("build", [_flux, _ltx], ids=["flux", "ltx-masked"])
def test_a_transformer_compiled_fullgraph_on_its_first_forward_matches_the_default(build: Any) -> None:
    """``torch.compile(model, fullgraph=True)`` after ``set_attention_backend("attnforge")``, its first forward the
    traced one: Flux's calls are the plain op, LTX's masked cross-attention the features op (its class undecided,
    whose decision could not be traced before 2026-12-01)."""
    df_integration.register()
    model, inputs = build()
    with torch.no_grad():
        want = model(**inputs).sample
        model.set_attention_backend("attnforge")
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(**inputs).sample
        model.reset_attention_backend()
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("build", [_flux, _unet], ids=["flux", "unet"])
def test_attnforge_processor_matches_the_default(build: Any, served: list[Any]) -> None:
    model, inputs = build()
    with torch.no_grad():
        want = model(**inputs).sample
        model.set_attn_processor(AttnforgeProcessor())
        got = model(**inputs).sample
    torch.testing.assert_close(got, want, **TOL)
    assert served


def test_backend_masks_and_causal_alignment_match_native() -> None:
    """The backend function against diffusers' native one: a [B, Sk] padding mask, top-left causal, lse."""
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    member = df_integration.register()
    assert df_integration.register() is member
    assert AttentionBackendName("attnforge") is member
    q, k, v = torch.randn(2, 3, 2, 8), torch.randn(2, 7, 2, 8), torch.randn(2, 7, 2, 8)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    for kwargs in ({"attn_mask": mask}, {"is_causal": True}):
        want = dispatch_attention_fn(q, k, v, backend=AttentionBackendName.NATIVE, **kwargs)
        got = dispatch_attention_fn(q, k, v, backend=member, **kwargs)
        torch.testing.assert_close(got, want, **TOL)
    out, lse = df_integration.attention_backend(q, k, v, return_lse=True)
    want_lse = torch.logsumexp(torch.einsum("bqhd,bkhd->bqhk", q, k) * 8**-0.5, dim=-1)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
                               .transpose(1, 2), **TOL)
    torch.testing.assert_close(lse, want_lse, **TOL)


def _cogvideox() -> tuple[Any, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = diffusers.CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, text_embed_dim=16,
        num_layers=1, sample_width=4, sample_height=4, sample_frames=5, patch_size=2, time_embed_dim=8,
        max_text_seq_length=5).eval()
    inputs = {"hidden_states": torch.randn(1, 2, 4, 4, 4), "encoder_hidden_states": torch.randn(1, 5, 16),
              "timestep": torch.tensor([3])}
    return model, inputs


@pytest.mark.parametrize(("build", "kind"), [(_flux, "backend"), (_unet, "processor")], ids=["flux", "unet"])
def test_route_changes_what_it_can_serve_and_matches(build: Any, kind: str, served: list[Any]) -> None:
    model, inputs = build()
    with torch.no_grad():
        want = model(**inputs).sample
        routed = df_integration.route(model)
        got = model(**inputs).sample
    torch.testing.assert_close(got, want, **TOL)
    assert getattr(routed, kind)
    assert routed.unchanged == ()
    assert served


def test_cogvideox_is_left_to_patch_sdpa(served: list[tuple[int, ...]]) -> None:
    """CogVideoX's joint-attention processor calls SDPA itself: route() leaves it, patch_sdpa serves it."""
    model, inputs = _cogvideox()
    with torch.no_grad():
        want = model(**inputs).sample
        routed = df_integration.route(model)
        with attnforge.patch_sdpa():
            got = model(**inputs).sample
    assert routed.unchanged == ("transformer_blocks.0.attn1: CogVideoXAttnProcessor2_0",)
    assert served == [(1, 2, 13, 8)]  # joint: 5 text + 2 frames x (4/2)^2 patches
    torch.testing.assert_close(got, want, **TOL)


def test_going_back_is_set_native_not_reset(served: list[Any]) -> None:
    """docs/integrations.md "Going back": after ``set_attention_backend("attnforge")``, diffusers' own
    ``reset_attention_backend()`` still runs attnforge (the processors fall back to the process-wide active backend,
    which the set changed); ``set_attention_backend("native")`` does not. Fails when diffusers changes either."""
    df_integration.register()
    model, inputs = _wan()
    with torch.no_grad():
        model.set_attention_backend("attnforge")
        model.reset_attention_backend()
        model(**inputs)
        assert served, "reset_attention_backend() now leaves attnforge: update docs/integrations.md"
        served.clear()
        model.set_attention_backend("native")
        model(**inputs)
    assert served == []


def test_the_model_benchmark_times_the_default_against_attnforge(monkeypatch: pytest.MonkeyPatch,
                                                                  served: list[Any]) -> None:
    """scripts/gpu/models_e2e.py's denoising step: its "default" rounds run diffusers' default attention, its
    "attnforge" rounds attnforge, in either order (until 2026-11-29 its default was ``reset_attention_backend()``,
    which kept attnforge, so Flux and Wan were timed against themselves)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
    import models_e2e

    ran: dict[str, list[bool]] = {}

    def paired_ms(torch: Any, fn: Any, use: dict[str, Any], **_: Any) -> dict[str, float]:
        for name in [*use, *reversed(use)]:
            use[name]()
            served.clear()
            fn()
            ran.setdefault(name, []).append(bool(served))
        return dict.fromkeys(use, 1.0)

    monkeypatch.setattr(models_e2e, "paired_ms", paired_ms)
    model, inputs = _wan()
    result = models_e2e._diffusion(torch, model, inputs, "tiny wan", heads=2, dim=8, tokens=16, cross=5)
    assert ran == {"default": [False, False], "attnforge": [True, True]}
    assert result["max_abs_diff"] < 1e-5
    served.clear()
    with torch.no_grad():
        model(**inputs)
    assert served == [], "the benchmark leaves the model on its default"


def test_set_attention_backend_that_reaches_no_module_warns_and_names_route(served: list[Any]) -> None:
    """diffusers sets a backend only on processors that call ``dispatch_attention_fn``: on a UNet (``AttnProcessor2_0``
    everywhere) ``set_attention_backend("attnforge")`` changed nothing and said nothing. It warns now; on Flux, whose
    processors dispatch, it does not (``filterwarnings = error`` would fail the test)."""
    model, inputs = _unet()
    with pytest.warns(UserWarning, match=r"reached no attention module .*route\(model\)"):
        model.set_attention_backend("attnforge")
    with torch.no_grad():
        model(**inputs)
    assert served == []  # what the warning says: nothing went to attnforge
    flux, _ = _flux()
    flux.set_attention_backend("attnforge")
    flux.set_attention_backend("native")

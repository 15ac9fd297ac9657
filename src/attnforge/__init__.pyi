# Types of attnforge's public API for mypy, pyright and IDEs. At run time __init__.py loads these lazily (the
# import stays cheap: no torch); this stub lets a type checker see them. It follows the shared API contract of
# attnforge.attention (keyword-only options, Literal choices); tests/test_typing.py checks it against the
# runtime signature and runs mypy --strict on a user script. The options other than return_lse are declared once,
# in _AttentionOptions (each may be left out; the defaults are those of the shared API contract, in comments).
from contextlib import AbstractContextManager
from typing import Literal, overload

import torch
from typing_extensions import TypedDict, Unpack

from attnforge.dispatch.explanation import Explanation
from attnforge.dispatch.sdpa_patch import SdpaPatch

__version__: str
__all__ = ["__version__", "attention", "explain", "patch_sdpa", "use_backend"]

Layout = Literal["bhsd", "bshd"]
Precision = Literal["exact", "allow_quantized"]
CausalAlignment = Literal["bottom_right", "top_left"]

class _AttentionOptions(TypedDict, total=False):
    attn_mask: torch.Tensor | None  # None
    dropout_p: float  # 0.0
    scale: float | None  # None: 1/sqrt(D)
    causal: bool  # False
    is_causal: bool | None  # None: SDPA's name for causal
    causal_alignment: CausalAlignment  # "bottom_right"
    enable_gqa: bool  # True
    window: tuple[int, int] | None  # None
    softcap: float | None  # None
    sinks: torch.Tensor | None  # None
    cu_seqlens_q: torch.Tensor | None  # None
    cu_seqlens_k: torch.Tensor | None  # None
    max_seqlen_q: int | None  # None
    max_seqlen_k: int | None  # None
    block_table: torch.Tensor | None  # None
    seqused_k: torch.Tensor | None  # None
    layout: Layout  # "bhsd"
    backend: str | None  # None: the dispatcher chooses
    precision: Precision  # "exact"

@overload
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_lse: Literal[False] = False,
    **options: Unpack[_AttentionOptions],
) -> torch.Tensor: ...
@overload
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_lse: Literal[True],
    **options: Unpack[_AttentionOptions],
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_lse: bool = False,
    **options: Unpack[_AttentionOptions],
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
def explain(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_lse: bool = False,
    **options: Unpack[_AttentionOptions],
) -> Explanation: ...
def use_backend(name: str) -> AbstractContextManager[None]: ...
def patch_sdpa() -> SdpaPatch: ...

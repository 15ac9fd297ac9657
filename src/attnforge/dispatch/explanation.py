"""Why a call goes where it goes: the result of :func:`attnforge.explain`."""

from __future__ import annotations

from dataclasses import dataclass

from attnforge.backends.adapter import AttentionCall, required_features
from attnforge.dispatch.policy import Rejection


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """Why a call goes where it goes (the result of :func:`explain`).

    Attributes:
        call: the call's properties.
        device: the device key records are looked up under.
        shape_class: the bench shape class the call falls in.
        chosen: the backend that serves the call; None when a forced backend cannot.
        forced: the backend was forced (``backend=`` or :func:`use_backend`).
        order: every backend that would be tried, in order (later ones serve if earlier ones raise).
        basis: for each entry of ``order``, why it stands there.
        rejected: every backend that will not be tried, with all its reasons.
        notes: what happened in this process that changed the order (a backend that raised on this call
            signature, and which one serves it instead), and how the chosen backend serves the call where its
            name does not say (SDPA's decode steps).
    """

    call: AttentionCall
    device: str
    shape_class: str
    chosen: str | None
    forced: bool
    order: tuple[str, ...]
    basis: tuple[str, ...]
    rejected: tuple[Rejection, ...]
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        c = self.call
        head = (f"attention B={c.batch} Hq={c.heads_q} Hkv={c.heads_kv} Sq={c.seqlen_q} Sk={c.seqlen_k}"
                f" D={c.head_dim} {c.dtype}{' causal' if c.causal else ''}{' +grad' if c.needs_grad else ''}"
                f" on {self.device} (shape class: {self.shape_class}"
                f"{'; K laid out [B, S, H, D]' if c.layout == 'bshd' else ''})")
        lines = [head]
        needed = required_features(c)
        if needed:
            dv = f"; Dv={c.head_dim_v}" if c.head_dim_v is not None else ""
            lines.append(f"  features: {', '.join(sorted(needed))}{dv}")
        if self.chosen is None:
            lines.append("  forced backend cannot serve this call" if self.forced else "  no backend serves this call")
        lines.extend(f"  note: {note}" for note in self.notes)
        for i, (name, why) in enumerate(zip(self.order, self.basis, strict=True)):
            label = ("forced" if self.forced else "chosen") if i == 0 else "then"
            lines.append(f"  {label:7} {name}: {why}")
        if self.rejected:
            lines.append("  skipped:")
            for rej in self.rejected:
                lines.append(f"    {rej.backend}: {'; '.join(rej.reasons)}")
        return "\n".join(lines)

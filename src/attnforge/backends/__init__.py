"""Attention backends behind one call convention: adapters, their capability tables, the registry.

Below verify, bench and dispatch (which all import it, never the other way). Submodules: ``adapter`` (the call
convention, :data:`~attnforge.backends.adapter.FEATURES`, the float64 reference), ``capabilities`` (what each
backend serves, as data from ``catalog/data/runtime.toml``), ``registry`` (one adapter per catalog backend and
the SDPA fallback), ``exact`` (the float32 math fallback that serves every feature), ``sdpa``, ``flex``,
``external`` (FlashAttention 2/3/4, SageAttention, xFormers), ``sdpa_original``. Importing this package loads
no torch.
"""

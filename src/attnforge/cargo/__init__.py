"""Rust builds that compile CUDA kernels: an environment and a kernel cache for candle's flash-attn crate.

Nothing is read at import time; see :mod:`attnforge.cargo.candle`.
"""

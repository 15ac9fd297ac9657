"""The signatures met with slim builds and real source trees (issue 15)."""

from __future__ import annotations

import pytest

from attnforge.diagnose import diagnose_text

README = """Processing /root/src/flash-attention/hopper
  Preparing metadata (setup.py): started
  Traceback (most recent call last):
    File "/root/src/flash-attention/hopper/setup.py", line 29, in <module>
      with open("../README.md", "r", encoding="utf-8") as fh:
  FileNotFoundError: [Errno 2] No such file or directory: '../README.md'
  error: subprocess-exited-with-error
"""
CUTLASS = """[1/5] /usr/local/cuda/bin/nvcc -c /b/hopper/flash_fwd_hdim128_bf16_sm90.cu -o /b/x.o
FAILED: /b/build/temp.linux-x86_64-cpython-312/flash_fwd_hdim128_bf16_sm90.o
/b/hopper/flash.h:9:10: fatal error: cute/tensor.hpp: No such file or directory
    9 | #include <cute/tensor.hpp>
compilation terminated.
ninja: build stopped: subcommand failed.
"""
SLIM = """  File "/venv/lib/python3.12/site-packages/flash_attn_interface.py", line 95, in _flash_attn_forward
    out, softmax_lse, *rest = flash_attn_3_cuda.fwd(
RuntimeError: This flash attention build does not support FP16.
"""


@pytest.mark.parametrize(
    ("log", "signature", "words"),
    [
        pytest.param(README, "file-outside-source-tree", "../README.md", id="outside-tree"),
        pytest.param(CUTLASS, "cutlass-headers-missing", "cute/tensor.hpp", id="cutlass"),
        pytest.param(SLIM, "slim-build-outside-capabilities", "compiled without FP16", id="slim"),
    ],
)
def test_signature(log: str, signature: str, words: str) -> None:
    d = diagnose_text(log, name="flash-attn-3")
    assert d.signature == signature
    assert words in d.cause
    assert d.fix and "{" not in " ".join(d.fix)


def test_the_fixes_name_the_commands() -> None:
    assert any("#subdirectory=hopper" in f for f in diagnose_text(README, name="flash-attn-3").fix)
    assert any("submodule update --init csrc/cutlass" in f for f in diagnose_text(CUTLASS).fix)

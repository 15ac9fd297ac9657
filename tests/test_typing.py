"""The public API is typed for users: mypy --strict on a user script sees attnforge.attention's real signature
(keyword-only options, Literal choices), and the stub (src/attnforge/__init__.pyi) agrees with the runtime."""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import SRC

USER_SCRIPT = textwrap.dedent("""
    import torch
    import attnforge

    q = torch.randn(1, 2, 8, 16)
    out: torch.Tensor = attnforge.attention(q, q, q, causal=True, layout="bshd", precision="allow_quantized")
    out2, lse = attnforge.attention(q, q, q, return_lse=True, window=(64, 0), is_causal=False)
    why = attnforge.explain(q, q, q, causal=True)
    with attnforge.use_backend("sdpa"):
        pass
    patch = attnforge.patch_sdpa()
    version: str = attnforge.__version__

    attnforge.attention(q, q, q, causal="yes")  # E: causal
    attnforge.attention(q, q, q, bogus_kw=1)  # E: bogus_kw
    attnforge.attention(q, q, q, layout="bsdh")  # E: layout
    attnforge.attention(q, q, q, precision="fast")  # E: precision
    attnforge.attention(q, q, q, True)  # E: positional option
    bad: torch.Tensor = attnforge.attention(q, q, q, return_lse=True)  # E: a tuple is not a tensor
""")


@pytest.mark.integration
@pytest.mark.slow
def test_mypy_strict_flags_misuse_in_a_user_script(tmp_path: Path) -> None:
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    env = {**os.environ, "MYPYPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--show-error-codes",
         "--cache-dir", str(tmp_path / "mypy-cache"), "--python-version", "3.11", str(script)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    flagged = {int(m.group(1)) for m in re.finditer(r"user\.py:(\d+): error", done.stdout)}
    lines = USER_SCRIPT.splitlines()
    expected = {i + 1 for i, line in enumerate(lines) if "# E:" in line}
    assert flagged == expected, done.stdout + done.stderr


def _stub_options(name: str) -> dict[str, str]:
    """keyword-only option -> annotation text of ``name`` in the stub (the last overload for attention), the
    fields of a ``**options: Unpack[TypedDict]`` included."""
    tree = ast.parse((SRC / "attnforge" / "__init__.pyi").read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert defs, name
    options = {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in defs[-1].args.kwonlyargs}
    kwarg = defs[-1].args.kwarg
    if kwarg is not None:
        assert isinstance(kwarg.annotation, ast.Subscript) and ast.unparse(kwarg.annotation.value) == "Unpack"
        typed = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}[ast.unparse(kwarg.annotation.slice)]
        for item in typed.body:
            assert isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name), ast.unparse(item)
            assert item.target.id not in options, f"{item.target.id} is declared twice"
            options[item.target.id] = ast.unparse(item.annotation)
    return options


CONTRACT = ["attn_mask", "dropout_p", "scale", "causal", "is_causal", "causal_alignment", "enable_gqa", "window",
            "softcap", "sinks", "return_lse", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
            "block_table", "seqused_k",
            "layout", "backend", "precision"]


def test_the_stub_follows_the_shared_api_contract() -> None:
    options = _stub_options("attention")
    assert sorted(options) == sorted(CONTRACT)  # keyword-only: the order is not part of the contract
    assert options["layout"] == "Layout"
    assert options["precision"] == "Precision"
    assert options["causal"] == "bool"
    assert _stub_options("explain") == options


@pytest.mark.parametrize("name", ["attention", "explain"])
def test_every_option_the_runtime_takes_is_in_the_stub(name: str) -> None:
    pytest.importorskip("torch")
    from attnforge.dispatch import runtime

    params = inspect.signature(getattr(runtime, name)).parameters.values()
    real = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert real <= set(_stub_options(name)), sorted(real - set(_stub_options(name)))
    # explain() passes its feature keywords on to attention()'s checks (**kwargs): the stub names them
    positional = [p.name for p in params
                  if p.kind not in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD)]
    assert positional == ["q", "k", "v"]


def test_the_import_stays_cheap() -> None:
    done = subprocess.run([sys.executable, "-c", "import attnforge, sys; print('torch' in sys.modules)"],
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.stdout.strip() == "False"

"""The options every deciding verb (``plan``, ``build``, ``install``) shares, read into one
:class:`~attnforge.install.inputs.RequestArgs` that :func:`~attnforge.install.inputs.assemble` turns into a request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from attnforge.cli._output import snapshot_option

F = TypeVar("F", bound=Callable[..., Any])

#: The click parameter names :func:`request_options` adds (the fields of ``RequestArgs``).
REQUEST_PARAMS = (
    "requirement", "source", "archs", "find_links", "index_urls", "from_source", "offline",
    "allow_unsupported_compiler", "head_dims", "dtypes", "no_backward", "features", "model_config", "snapshot_path",
    "abi",
)


#: Options that may be repeated (``--arch 9.0 --arch 12.0``): (option, parameter, metavar, help).
_REPEATED = (
    ("--arch", "archs", "CC[,CC]", "Target compute capabilities, e.g. 9.0,12.0 (default: the detected GPUs')."),
    ("--find-links", "find_links", "DIR", "A directory of wheels (and sdists) to consider."),
    ("--index-url", "index_urls", "URL",
     "A PEP 503 index to consider (e.g. file:///shared/attnforge/simple from `cache export`)."),
    ("--head-dim", "head_dims", "D[,D]",
     "Slim build: only these head dims (e.g. 64,128); a kernel serves every D up to its own."),
    ("--dtype", "dtypes", "T[,T]", "Slim build: only these dtypes (bf16, fp16, fp8)."),
    ("--features", "features", "F[,F]", "Slim build: optional features to keep (paged-kv, varlen, softcap, local, "
     "split, ...); the others are left out."),
)
#: On/off switches: (option, help).
_FLAGS = (
    ("--from-source", "Skip prebuilt binaries (cached and listed) and build."),
    ("--offline", "Never touch the network (cache, find-links, file:// indexes, cached listings)."),
    ("--allow-unsupported-compiler", "When nvcc refuses the host compiler (gcc/clang/MSVC outside its supported "
     "range), build anyway with nvcc's -allow-unsupported-compiler. At your own risk: the build may fail later or "
     "miscompile."),
    ("--no-backward", "Slim build: forward only (inference)."),
)


#: ``--abi``: how a binary binds to torch (``install``, ``build``, ``plan`` and ``fleet plan``/``fleet build``).
abi_option = click.option(
    "--abi", "abi", type=click.Choice(["torch", "torch-stable"]), default=None,
    help="How the binary binds to torch: 'torch' builds against this exact torch (less host time a call where the "
         "project's own build is the stable ABI, as FlashAttention-3's; `attnforge plan` says how much; rebuilt when "
         "torch changes), 'torch-stable' the libtorch stable ABI (one binary for every torch from its minimum up). "
         "Default: either; a build follows the project's own choice.")


def request_options(func: F) -> F:
    """``REQUIREMENT``, ``--source``, ``--arch``, ``--find-links``, ``--index-url``, ``--from-source``,
    ``--offline``, ``--allow-unsupported-compiler``, the slim options and ``--snapshot``."""
    options = [
        click.argument("requirement", required=False),
        click.option("--source", "source", default=None, metavar="PATH_OR_URL",
                     help="Build this source instead of the catalog's: a directory, an sdist, an sdist URL, or "
                          "git+URL[@REF], each with an optional #subdirectory=DIR; allows names outside the "
                          "catalog (any torch extension)."),
        *(click.option(flag, param, multiple=True, metavar=metavar, help=text)
          for flag, param, metavar, text in _REPEATED),
        *(click.option(flag, is_flag=True, help=text) for flag, text in _FLAGS),
        click.option("--model", "model_config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Slim build: take the head dims from a Hugging Face config.json."),
        abi_option,
    ]
    for option in reversed(options):
        func = option(func)
    return snapshot_option(func)  # type: ignore[no-any-return]


def request_args(params: dict[str, Any], **more: Any) -> Any:
    """The :class:`~attnforge.install.inputs.RequestArgs` of a command's click parameters."""
    from attnforge.provision import RequestArgs

    return RequestArgs(**{k: params[k] for k in REQUEST_PARAMS}, **more)


#: The slim-build parameters (a subset of ``RequestArgs``): what ``fleet plan``/``fleet build`` take besides their
#: own cluster options.
SLIM_PARAMS = ("head_dims", "dtypes", "no_backward", "features", "model_config")


def slim_options(func: F) -> F:
    """Only the slim build options (``--head-dim``, ``--dtype``, ``--features``, ``--no-backward``, ``--model``),
    spelled as :func:`request_options` spells them; for verbs with a request of their own (``fleet``)."""
    options = [
        *(click.option(flag, param, multiple=True, metavar=metavar, help=text)
          for flag, param, metavar, text in _REPEATED if param in SLIM_PARAMS),
        click.option("--no-backward", is_flag=True, help=dict(_FLAGS)["--no-backward"]),
        click.option("--model", "model_config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Slim build: take the head dims from a Hugging Face config.json."),
    ]
    for option in reversed(options):
        func = option(func)
    return func

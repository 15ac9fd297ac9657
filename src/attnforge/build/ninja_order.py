"""Longest compile units first: reorder a torch extension's ``build.ninja`` before ninja runs it.

Why: torch's ``BuildExtension`` writes one ``build`` line per source, in the order of the project's source list,
and runs ``ninja`` at once. Ninja (1.12 and later) runs ready edges by critical-path weight, then in ascending
manifest order when weights tie (``EdgePriorityLess`` in ninja's ``src/graph.h``), and every compile edge of
an extension has the same weight. FlashAttention-2 lists its backward and head-dim-256 kernels late, so the
longest compiles start last and the final minutes run on a few cores (the issue measured <= 3 of 16).

What: a ``ninja`` shim is put first on the build's PATH (:func:`install_shim`); it reorders the compile lines
of ``build.ninja`` by expected cost (the durations in ``.ninja_log`` from a kept build tree when there are
any, else a guess from the file name: backward before forward, larger head dims first) and then runs the real
ninja with the same arguments. Only the order of single-line compile statements changes; anything the shim
cannot parse, or any error, leaves the manifest untouched. ``ATTNFORGE_NINJA_ORDER=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

_COMPILE = re.compile(r"build (?P<out>\S+): (?:cuda_)?compile \S.*")
_HDIM = re.compile(r"hdim(\d+)")
SHIM_NAME = "ninja"


def guessed_cost(output: str) -> tuple[int, int, int]:
    """Bigger is slower: (backward, head dim, causal). FlashAttention's kernel files are named like
    ``flash_bwd_hdim256_bf16_causal_sm80.cu``; other projects' files all tie and keep their order."""
    name = Path(output).name.lower()
    hdim = _HDIM.search(name)
    return (int("bwd" in name or "backward" in name), int(hdim.group(1)) if hdim else 0, int("causal" in name))


def ninja_log_durations(build_dir: Path) -> dict[str, float]:
    """output -> seconds from ``.ninja_log`` (v5: start ms, end ms, mtime, output, hash), the last entry wins."""
    durations: dict[str, float] = {}
    try:
        lines = (build_dir / ".ninja_log").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return durations
    for line in lines:
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            durations[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return durations


def reorder(manifest: str, durations: Mapping[str, float]) -> str:
    """The manifest with its single-line compile statements in descending expected cost (stable: ties keep
    their order); every other line stays where it is. With ``durations`` for every compile edge they decide;
    otherwise the name-based guess does."""
    lines = manifest.split("\n")
    slots = [i for i, line in enumerate(lines) if _COMPILE.fullmatch(line)
             and not lines[i].endswith("$") and not (i + 1 < len(lines) and lines[i + 1].startswith(" "))]
    outs = {i: _COMPILE.fullmatch(lines[i]).group("out") for i in slots}  # type: ignore[union-attr]
    measured = bool(outs) and all(o in durations for o in outs.values())

    def cost(i: int) -> tuple[float, ...]:
        return (durations[outs[i]],) if measured else tuple(float(x) for x in guessed_cost(outs[i]))

    ordered = sorted(slots, key=lambda i: (tuple(-c for c in cost(i)), slots.index(i)))
    new = list(lines)
    for slot, source in zip(slots, ordered, strict=True):
        new[slot] = lines[source]
    return "\n".join(new)


def install_shim(directory: Path, environ: Mapping[str, str]) -> str | None:
    """Write the ``ninja`` shim into ``directory`` and return the PATH to give the build, or None when the
    shim does not apply (turned off, Windows, or no real ninja on PATH)."""
    path = environ.get("PATH", os.defpath)
    off = environ.get("ATTNFORGE_NINJA_ORDER", "1") == "0" or sys.platform == "win32"
    if off or not shutil.which("ninja", path=path):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    src = Path(__file__).resolve().parents[2]
    script = directory / SHIM_NAME
    script.write_text(
        "#!/bin/sh\n"
        f'exec "{sys.executable}" -c "import sys; sys.path.insert(0, sys.argv.pop(1)); '
        f'from attnforge.build.ninja_order import main; main()" "{src}" "$@"\n'
    )
    script.chmod(0o755)
    return f"{directory}{os.pathsep}{path}"


def main(argv: Sequence[str] | None = None) -> None:
    """The shim: reorder ``build.ninja`` in the directory ninja will use, then exec the real ninja."""
    args = list(sys.argv[1:] if argv is None else argv)
    real = shutil.which("ninja", path=_without_shims(os.environ.get("PATH", os.defpath)))
    if real is None:
        sys.exit("attnforge ninja shim: no real ninja on PATH")
    if "-t" not in args and "--version" not in args:
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):  # never stop a build over its order
            _reorder_in_place(args)
    os.execv(real, [real, *args])  # noqa: S606 - becomes the real ninja, same argv, as torch asked for it


def _without_shims(path: str) -> str:
    keep = []
    for entry in path.split(os.pathsep):
        shim = Path(entry) / SHIM_NAME
        try:
            if shim.is_file() and b"attnforge.build.ninja_order" in shim.read_bytes()[:400]:
                continue
        except OSError:
            pass
        keep.append(entry)
    return os.pathsep.join(keep)


def _reorder_in_place(args: list[str]) -> None:
    build_dir = Path(args[args.index("-C") + 1]) if "-C" in args[:-1] else Path.cwd()
    manifest = build_dir / (args[args.index("-f") + 1] if "-f" in args[:-1] else "build.ninja")
    text = manifest.read_text(encoding="utf-8")
    new = reorder(text, ninja_log_durations(build_dir))
    if new != text:
        tmp = manifest.with_name(manifest.name + ".attnforge-tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, manifest)

"""Facts a log states about itself: the package being built, the torch it ran against, a module's full import
path, and the log as printable text.

They fill placeholders a snapshot would otherwise fill, and let the diagnosis rank a root cause the log shows
(``torch.__version__ = 2.13.0+cpu``) above the symptom it produced ("nvcc was not found").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PACKAGE = (
    re.compile(r"Building wheel for (?P<name>[A-Za-z0-9][\w.-]*) \("),
    re.compile(r"Failed (?:building wheel for|to build) (?P<name>[A-Za-z0-9][\w.-]*)"),
    re.compile(r"attnforge: build(?:ing)? (?P<name>[A-Za-z0-9][\w.-]*)"),
    re.compile(r"^[ \t]*Collecting (?P<name>[A-Za-z0-9][\w.-]*?)(?:[=<>!~\[ ]|$)", re.MULTILINE),
)
_TORCH = (
    re.compile(r"torch\.__version__\s*[=:]\s*['\"]?(?P<v>\d+\.\d+[\w.+-]*)"),
    re.compile(r"\btorch(?: version)?[ :=]+(?P<v>\d+\.\d+\.\d+\+(?:cpu|cu\d+|rocm[\d.]+))\b"),
    re.compile(r"\btorch-(?P<v>\d+\.\d+\.\d+\+(?:cpu|cu\d+|rocm[\d.]+))"),
)
#: nvcc's own banner (``nvcc --version``, printed by build scripts and CMake): the toolkit that really ran.
_NVCC_RELEASE = re.compile(r"Cuda compilation tools, release (?P<v>\d+\.\d+)"
                           r"|The CUDA compiler identification is NVIDIA (?P<cmake>\d+\.\d+)")
#: The nvcc a command line invoked, or CUDA_HOME as a build script printed it: the version is in the folder name
#: (``/usr/local/cuda-12.4/bin/nvcc``, ``C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v12.4\bin\nvcc``).
#: A POSIX path starts where a run of path characters starts (the look-behind) and a Windows path stops at the next
#: ``:``, so each run is scanned once: a lazy scan from every ``/`` of a long run would be quadratic.
_PATH_CHAR = r"[^\s'\":;=,()\[\]]"
_CUDA_PATH = (
    re.compile(rf"(?<!{_PATH_CHAR})(?P<home>/{_PATH_CHAR}*?/cuda-(?P<v>\d+\.\d+))/bin/nvcc\b"),
    re.compile(r"(?P<home>[A-Za-z]:\\[^\n\"';:]*?\\CUDA\\v(?P<v>\d+\.\d+))\\bin\\nvcc", re.IGNORECASE),
    re.compile(rf"CUDA_HOME[ \t]*[=:][ \t]*['\"]?(?P<home>/{_PATH_CHAR}*?/cuda-(?P<v>\d+\.\d+))/?(?=['\"\s]|$)",
               re.MULTILINE),
)
#: The host compiler's version line: ``gcc --version``, ``gcc -v``, CMake's identification, clang's banner.
_HOST_COMPILER = (
    re.compile(r"^[ \t]*(?:gcc|g\+\+|c\+\+|cc)(?:-\d+)? \([^)\n]*\) (?P<v>\d+\.\d+(?:\.\d+)?)", re.MULTILINE),
    re.compile(r"\bgcc version (?P<v>\d+\.\d+(?:\.\d+)?)"),
    re.compile(r"The CXX compiler identification is GNU (?P<v>\d+\.\d+(?:\.\d+)?)"),
)
_CLANG = re.compile(r"\bclang version (?P<v>\d+\.\d+(?:\.\d+)?)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_UNPRINTABLE = re.compile(r"[^\t\n\x20-\x7e\u00a0-\ufffc]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogFacts:
    """What the log says about the build it records (None where it says nothing).

    Attributes:
        package: the distribution being built.
        torch_version: the torch the build ran against (``2.13.0+cpu``).
        nvcc_version: ``12.4`` from nvcc's banner ("Cuda compilation tools, release 12.4, V12.4.131"), else from
            the folder of the nvcc the log invoked (``/usr/local/cuda-12.4/bin/nvcc``).
        cuda_home: that toolkit's folder (``/usr/local/cuda-12.4``), when the log shows one.
        host_compiler: ``gcc 11.4.0`` or ``clang 17.0.6``, from the compiler's version line.
    """

    package: str | None
    torch_version: str | None
    nvcc_version: str | None = None
    cuda_home: str | None = None
    host_compiler: str | None = None

    @property
    def torch_cpu(self) -> bool:
        """The log shows a CPU-only torch (``+cpu`` local version)."""
        return bool(self.torch_version and self.torch_version.endswith("+cpu"))

    @property
    def torch_cuda(self) -> str | None:
        """``12.8`` from a ``+cu128`` torch, None otherwise."""
        m = re.search(r"\+cu(\d+)(\d)$", self.torch_version or "")
        return f"{m[1]}.{m[2]}" if m else None


def log_facts(text: str) -> LogFacts:
    """The facts ``text`` states about its own build: the toolchain that really ran, before any snapshot's."""
    path = next((m for m in (p.search(text) for p in _CUDA_PATH) if m is not None), None)
    release = _NVCC_RELEASE.search(text)
    gcc = _first(_HOST_COMPILER, text, "v")
    clang = _CLANG.search(text)
    return LogFacts(package=_first(_PACKAGE, text, "name"), torch_version=_first(_TORCH, text, "v"),
                    nvcc_version=(release["v"] or release["cmake"]) if release else (path["v"] if path else None),
                    cuda_home=path["home"] if path else None,
                    host_compiler=f"gcc {gcc}" if gcc else (f"clang {clang['v']}" if clang else None))


def _first(patterns: tuple[re.Pattern[str], ...], text: str, group: str) -> str | None:
    for pattern in patterns:
        m = pattern.search(text)
        if m is not None:
            return m[group]
    return None


def printable(text: str) -> tuple[str, int]:
    """``text`` without terminal escapes and control bytes (a binary file, a coloured log).

    Returns:
        The printable text and how many characters were dropped (escape sequences count as one).
    """
    no_ansi, escapes = _ANSI.subn("", text.replace("\r\n", "\n"))
    dropped = 0

    def count(m: re.Match[str]) -> str:
        nonlocal dropped
        dropped += len(m[0])
        return ""

    clean = _UNPRINTABLE.sub(count, no_ansi.replace("\r", "\n"))
    return clean, dropped + escapes


#: The longest line the signatures read: a longer one keeps its first and last half of this (the compiler's words
#: open a line; a command's output file closes it). Patterns run in linear time, so this bounds the work and the
#: evidence shown, not a backtracking blow-up.
MAX_LINE_CHARS = 32 * 1024
_CUT = " [... {n} characters left out ...] "


def clipped(text: str, max_line_chars: int = MAX_LINE_CHARS) -> tuple[str, int]:
    """``text`` with every line longer than ``max_line_chars`` cut to its first and last ``max_line_chars // 2``
    characters, a marker saying how many were left out in between.

    Returns:
        The text and how many lines were cut.
    """
    if len(text) <= max_line_chars:
        return text, 0
    half = max_line_chars // 2
    lines = text.split("\n")
    cut = 0
    for i, line in enumerate(lines):
        if len(line) > max_line_chars:
            lines[i] = line[:half] + _CUT.format(n=len(line) - 2 * half) + line[-half:]
            cut += 1
    return ("\n".join(lines), cut) if cut else (text, 0)


def full_module(module: str, text: str) -> str:
    """The full import path of ``module`` as the log shows it (``_fused`` -> ``sageattention._fused``).

    Windows names only the last component ("DLL load failed while importing _fused"); the traceback says where
    it was imported from: a dotted name ending in ``.module``, or a relative import (``from . import _fused``)
    in a file under ``site-packages/<package>/``.
    """
    if "." in module:
        return module
    dotted = re.search(rf"(?<![\w.\\/])((?:[A-Za-z_]\w*\.)+{re.escape(module)})\b(?!\.\w)", text)
    if dotted is not None:
        return dotted[1]
    lines = text.splitlines()
    relative = re.compile(rf"^\s*from \.(?:{re.escape(module)}\s+import\b|\s+import\s+.*\b{re.escape(module)}\b)")
    for i, line in enumerate(lines):
        if relative.search(line):
            for prev in reversed(lines[max(0, i - 3) : i]):
                m = re.search(r'File "(?P<path>[^"]+)"', prev)
                if m is not None:
                    package = _package_of(m["path"])
                    if package:
                        return f"{package}.{module}"
    return module


def _package_of(path: str) -> str | None:
    """``C:\\...\\site-packages\\sageattention\\quant.py`` -> ``sageattention`` (the importing file's package)."""
    parts = re.split(r"[\\/]", path)
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            inside = parts[parts.index(anchor) + 1 : -1]
            return ".".join(inside) or None
    return parts[-2] if len(parts) >= 2 and parts[-2].isidentifier() else None

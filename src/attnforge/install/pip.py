"""``pip install --no-deps`` of one artifact into an interpreter, without ever changing its torch or
silently overwriting another distribution's files.

Three guards keep the user's torch as it is: the wheel may not *be* a protected distribution (torch and its
companions); a ``Requires-Dist`` on torch that the installed torch does not satisfy refuses the install (the
wheel was built for another torch, and satisfying it would mean replacing torch); and pip runs with
``--no-deps --no-index`` while torch's version is read before and after, so a change cannot pass silently.

A wheel that ships files another installed distribution owns (flash-attn 2's ``flash_attn/cute/`` over
flash-attn-4's) is refused unless the caller allows the overlap; see :mod:`attnforge.install.overlap`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from attnforge._system.runner import Completed, Runner
from attnforge.build.frontend import Installer, installer_for
from attnforge.catalog import load_catalog
from attnforge.errors import InstallError
from attnforge.install.overlap import Overlap, installed_overlaps, refusal
from attnforge.install.wheelfile import WheelMetadata, read_wheel_metadata

#: Distributions attnforge never installs, replaces or upgrades: the user's torch stack (toolchain.toml
#: ``[torch_stack]``, read once when this module is first imported).
PROTECTED = load_catalog().tools.torch_stack.protected

#: the versions of the names in argv, as the interpreter sees them (with its own start-up: .pth files run)
_PLAIN_VERSIONS = """
import importlib.metadata as m, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""

#: Run with ``python -S``: site-packages are put on sys.path as ``site`` would (the venv's, then the base's
#: when pyvenv.cfg allows it) but no ``.pth`` file is executed, so reading versions right after an install
#: never runs code from the wheel just installed (a ``.pth`` line starting with ``import`` is code).
_VERSIONS_SCRIPT = """
import os, site, sys, sysconfig
here = os.path.dirname(os.path.abspath(sys.executable))
cfgs = [os.path.join(d, "pyvenv.cfg") for d in (here, os.path.dirname(here))]
cfg = next((c for c in cfgs if os.path.isfile(c)), None)
paths, system = [], True
if cfg is not None:
    root = os.path.dirname(cfg)
    # the venv scheme: Debian's patched default ("posix_local") points at <root>/local/... under -S
    schemes = sysconfig.get_scheme_names()
    scheme = "venv" if "venv" in schemes else ("nt" if os.name == "nt" else "posix_prefix")
    paths += [sysconfig.get_path(k, scheme, vars={"base": root, "platbase": root}) for k in ("purelib", "platlib")]
    for line in open(cfg, encoding="utf-8"):
        key, _, value = line.partition("=")
        if key.strip().lower() == "include-system-site-packages":
            system = value.strip().lower() == "true"
if system:
    paths += site.getsitepackages() + [site.getusersitepackages()]
dirs = [p for p in dict.fromkeys(paths) if os.path.isdir(p)]
for d in list(dirs):  # the path lines of .pth files (editable installs, bridges); import lines never run
    for pth in sorted(f for f in os.listdir(d) if f.endswith(".pth")):
        try:
            lines = open(os.path.join(d, pth), encoding="utf-8").read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                full = os.path.join(d, line)
                if os.path.isdir(full) and full not in dirs:
                    dirs.append(full)
sys.path[1:1] = dirs
""" + _PLAIN_VERSIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class PipInstallResult:
    """One ``pip install``.

    Attributes:
        wheel: the file installed.
        python: the interpreter it went into.
        torch_version: torch's version before and after (unchanged, or pip would have been reported).
        missing_requirements: requirements of the wheel (other than torch) not installed; ``--no-deps`` left
            them for the user, with the command to get them.
        duration_s: wall time of pip itself.
        overlaps: files of other distributions the install replaced (only with ``allow_overlap``).
        installer: the pip frontend that installed it (the interpreter's pip, or uv).
        previous_version: the version of the same distribution that was there before (None: this install
            added it, so removing it again restores the environment).
    """

    wheel: str
    python: str
    name: str
    version: str
    torch_version: str | None
    missing_requirements: tuple[str, ...]
    duration_s: float
    overlaps: tuple[Overlap, ...] = ()
    installer: Installer | None = None
    previous_version: str | None = None


def check_requirements(meta: WheelMetadata, installed: Mapping[str, str | None]) -> tuple[str, ...]:
    """Refuse a wheel that would need a different torch; return the other requirements not met.

    Args:
        meta: the wheel's metadata.
        installed: distribution name -> installed version (None when absent) in the target interpreter, for
            torch and every requirement of the wheel.

    Raises:
        InstallError: the wheel is a protected distribution, or requires a torch the interpreter lacks.
    """
    if canonicalize_name(meta.name) in PROTECTED:
        raise InstallError(
            f"refusing to install {meta.name}: attnforge never replaces the torch stack",
            hint="install torch yourself from https://pytorch.org/get-started/locally/",
        )
    missing: list[str] = []
    for text in meta.requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        have = installed.get(name)
        ok = have is not None and _satisfies(have, req)
        if name in PROTECTED and not ok:
            raise InstallError(
                f"{meta.name} {meta.version} requires {req}, but this interpreter has "
                f"{req.name} {have or '(not installed)'}",
                cause="installing it would need a different torch, and attnforge never changes your torch",
                hint="build it for the torch you have: `attnforge install "
                f"{canonicalize_name(meta.name)} --from-source`",
            )
        if not ok:
            missing.append(str(req))
    return tuple(missing)


def _satisfies(version: str, req: Requirement) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def installed_versions(python: str, names: list[str], runner: Runner) -> dict[str, str | None]:
    """Versions of ``names`` as ``importlib.metadata`` sees them in the interpreter ``python``.

    Raises:
        InstallError: the interpreter could not be run.
    """
    if _NEEDS_PTH_CODE.get(python):
        return _read_versions(runner, [python, "-c", _PLAIN_VERSIONS, *names], python)
    found = _read_versions(runner, [python, "-S", "-c", _VERSIONS_SCRIPT, *names], python)
    unseen = [n for n in names if found.get(canonicalize_name(n)) is None]
    if unseen and python not in _NEEDS_PTH_CODE:
        # the first question about this interpreter (before anything is installed): does it reach packages
        # only through .pth code (a bridge to another environment)? Then it is asked the plain way from now
        # on, as its own start-up does; otherwise never, so a wheel's .pth does not run during an install.
        plain = _read_versions(runner, [python, "-c", _PLAIN_VERSIONS, *unseen], python)
        extra = {k: v for k, v in plain.items() if v is not None}
        _NEEDS_PTH_CODE[python] = bool(extra)
        found.update(extra)
    else:
        _NEEDS_PTH_CODE.setdefault(python, False)
    return found


#: per interpreter path: whether its packages are visible only with its .pth code run (decided once)
_NEEDS_PTH_CODE: dict[str, bool] = {}


def _read_versions(runner: Runner, argv: list[str], python: str) -> dict[str, str | None]:
    done = runner.run(argv, timeout_s=120)
    if not done.ok:
        raise InstallError(f"could not read installed packages of {python}", cause=_tail(done))
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {canonicalize_name(k): v for k, v in raw.items()}


def pip_install(
    wheel: Path,
    *,
    runner: Runner,
    python: str = sys.executable,
    allow_overlap: bool = False,
    timeout_s: float = 900,
) -> PipInstallResult:
    """Install one wheel with ``python -m pip install --no-deps --no-index --force-reinstall``.

    In an environment without pip (``uv venv``), ``uv pip install --python PY`` does it instead.

    Args:
        wheel: a verified wheel (from :meth:`attnforge.cache.Store.get`).
        runner: the subprocess seam.
        python: the interpreter to install into (the running one by default).
        allow_overlap: install even when the wheel ships files another installed distribution owns (they are
            replaced; the result's ``overlaps`` says which). Files of the torch stack are never replaced.

    Raises:
        InstallError: the wheel would change torch, would overwrite another distribution's files (without
            ``allow_overlap``; the message names the distribution, the files and the fix), pip failed (its last
            lines are the cause), or torch's version changed anyway.
    """
    meta = read_wheel_metadata(wheel)
    names = sorted({"torch", canonicalize_name(meta.name), *(_req_name(r) for r in meta.requires_dist)} - {""})
    before = installed_versions(python, names, runner)
    missing = check_requirements(meta, before)
    installer = installer_for(python, runner=runner)
    overlaps = installed_overlaps(wheel, name=meta.name, python=python, runner=runner)
    if overlaps and (not allow_overlap or any(canonicalize_name(o.distribution) in PROTECTED for o in overlaps)):
        raise refusal(overlaps, name=meta.name, version=meta.version, installer=installer, protected=PROTECTED)
    argv = installer.argv("install", "--no-deps", "--no-index", "--force-reinstall", "--disable-pip-version-check",
                          "--no-input", "--quiet", str(wheel))
    done = runner.run(argv, timeout_s=timeout_s)
    if not done.ok:
        raise InstallError(
            f"{installer.kind} could not install {wheel.name} into {python}", cause=_tail(done),
            hint="run the same command with -v to see pip's full output: " + " ".join(argv),
        )
    after = installed_versions(python, ["torch"], runner)
    if after.get("torch") != before.get("torch"):
        raise InstallError(
            f"torch changed from {before.get('torch')} to {after.get('torch')} while installing {wheel.name}",
            cause="something other than attnforge's --no-deps install touched torch",
            hint="reinstall the torch you had: pip install torch==" + str(before.get("torch")),
        )
    return PipInstallResult(
        wheel=str(wheel), python=python, name=meta.name, version=meta.version,
        torch_version=after.get("torch"), missing_requirements=missing, duration_s=done.duration_s,
        overlaps=overlaps, installer=installer, previous_version=before.get(canonicalize_name(meta.name)),
    )


def uninstall(name: str, *, runner: Runner, python: str = sys.executable, timeout_s: float = 300) -> str | None:
    """Remove the distribution ``name`` from ``python`` (``pip uninstall -y``): the roll-back of an install this
    run made. The torch stack is never removed.

    Returns:
        None when it was removed, else why not (the installer's last lines).
    """
    if canonicalize_name(name) in PROTECTED:
        return f"{name} is part of the torch stack, which attnforge never removes"
    installer = installer_for(python, runner=runner)
    done = runner.run(installer.argv("uninstall", "-y", "--disable-pip-version-check", name), timeout_s=timeout_s)
    return None if done.ok else _tail(done)


def _req_name(text: str) -> str:
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return ""


def _tail(done: Completed, lines: int = 15) -> str:
    return "\n".join(done.output.strip().splitlines()[-lines:]) or f"exit status {done.returncode}"


def install_requirements(
    requirements: tuple[str, ...],
    *,
    runner: Runner,
    python: str = sys.executable,
    find_links: tuple[str, ...] = (),
    index_urls: tuple[str, ...] = (),
    offline: bool = False,
    scratch: Path,
    timeout_s: float = 900,
) -> tuple[str, ...]:
    """Install the requirements a backend needs (FlashAttention-4's CuTe DSL, say), with the torch stack pinned.

    A constraints file pins every installed protected distribution (torch, triton, ...) to its current version,
    so pip can satisfy the rest but never replace torch; offline, only ``find_links`` are used.

    Returns:
        The requirements pip installed (empty when there was nothing to do).

    Raises:
        InstallError: pip could not satisfy them (its last lines are the cause), or torch changed anyway.
    """
    reqs = tuple(r for r in requirements if _req_name(r) not in PROTECTED)
    if not reqs:
        return ()
    pinned = {k: v for k, v in installed_versions(python, sorted(PROTECTED), runner).items() if v}
    scratch.mkdir(parents=True, exist_ok=True)
    constraints = scratch / "attnforge-torch-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pinned.items())))
    installer = installer_for(python, runner=runner)
    argv = installer.argv("install", "--disable-pip-version-check", "--no-input", "--quiet", "-c", str(constraints))
    for d in find_links:
        argv += ["--find-links", d]
    if offline:
        argv.append("--no-index")
    elif index_urls:
        argv += ["--index-url", index_urls[0], *(a for u in index_urls[1:] for a in ("--extra-index-url", u))]
    done = runner.run([*argv, *reqs], timeout_s=timeout_s)
    if not done.ok:
        raise InstallError(
            f"{installer.kind} could not install the backend's requirements: " + ", ".join(reqs), cause=_tail(done),
            hint="put their wheels in a --find-links directory (offline), or install them yourself: "
                 + " ".join(installer.argv("install", *reqs)),
        )
    after = installed_versions(python, sorted(pinned), runner)
    changed = {k: (v, after.get(k)) for k, v in pinned.items() if after.get(k) != v}
    if changed:
        raise InstallError(
            "the torch stack changed while installing requirements: "
            + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
            hint="reinstall the torch you had: pip install " + " ".join(f"{k}=={a}" for k, (a, _) in changed.items()),
        )
    return reqs

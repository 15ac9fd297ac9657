"""Ask a package index through pip (or uv), so ``pip.conf``, ``PIP_*``/``UV_*``, netrc, keyring, credentials in
the URL and proxies apply exactly as they do for ``pip install``.

Two questions: which versions of a project an index offers this interpreter (:func:`index_versions`, from
``pip index versions``), and which file pip would install for a requirement, with its URL and sha256
(:func:`index_pick`, from ``pip install --dry-run --report``). The plan's own listings (``fetch/indexes.py``)
go through attnforge's one HTTP client instead; these are for where pip's own configuration must apply.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from attnforge._system.runner import Completed, Runner
from attnforge.build.frontend import Installer, installer_for
from attnforge.errors import InstallError


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexPick:
    """The file pip (or uv) would install for a requirement.

    Attributes:
        url: where it would be downloaded from (None from uv, which does not report it).
        sha256: its hash as the index published it (None when the index gives none, or from uv).
    """

    name: str
    version: str
    url: str | None
    sha256: str | None


def _source_options(index_urls: tuple[str, ...], find_links: tuple[str, ...], offline: bool) -> list[str]:
    out = [a for d in find_links for a in ("--find-links", d)]
    if offline:
        out.append("--no-index")
    elif index_urls:
        out += ["--index-url", index_urls[0], *(a for u in index_urls[1:] for a in ("--extra-index-url", u))]
    return out


#: pip's and uv's words for an index that refused the credentials or could not be reached (pip then says "no
#: matching distribution", which must not read as "the index has nothing").
_REFUSED = re.compile(r"\b40[13] (Error|Client Error|Unauthorized|Forbidden)|Credentials not correct|"
                      r"status code 40[13]|Failed to establish a new connection|Could not fetch URL|ProxyError|"
                      r"SSLError|Name or service not known", re.IGNORECASE)


def _refused(what: str, installer: Installer, done: Completed) -> InstallError | None:
    line = next((ln for ln in done.output.splitlines() if _REFUSED.search(ln)), None)
    if line is None:
        return None
    return InstallError(f"the index could not be read (refused or unreachable) while trying to {what}",
                        cause=line.strip(), hint="check the index URL, the user and password in it, your netrc or "
                        "keyring, proxy settings, or pip's/uv's configuration")


def _failed(what: str, installer: Installer, done: Completed) -> InstallError:
    tail = "\n".join(done.output.strip().splitlines()[-10:]) or f"exit status {done.returncode}"
    return InstallError(f"{installer.kind} could not {what}", cause=tail,
                        hint="check the index URL, your network or proxy settings and pip's/uv's configuration")


def index_versions(
    name: str, *, python: str, runner: Runner, index_urls: tuple[str, ...] = (),
    find_links: tuple[str, ...] = (), offline: bool = False,
) -> tuple[str, ...]:
    """Every version of ``name`` the configured index(es) offer this interpreter, newest first.

    Raises:
        InstallError: pip failed (unreachable index, bad credentials), or the interpreter has only uv, which has
            no listing command (the hint says what to do).
    """
    installer = installer_for(python, runner=runner)
    if installer.kind != "pip":
        raise InstallError(f"listing the versions of {name} needs pip in {python}",
                           cause="uv has no command that lists an index's versions",
                           hint=f"add pip to the environment: `{python} -m ensurepip`, or `uv venv --seed`")
    argv = installer.argv("index", "versions", "--disable-pip-version-check", "--pre",
                          *_source_options(index_urls, find_links, offline), name)
    done = runner.run(argv, timeout_s=300)
    refused = _refused(f"list the versions of {name}", installer, done)
    if refused is not None:
        raise refused
    if not done.ok:
        if "No matching distribution" in done.output:
            return ()
        raise _failed(f"list the versions of {name}", installer, done)
    match = re.search(r"^Available versions:\s*(.*)$", done.stdout, flags=re.MULTILINE)
    found = [v.strip() for v in (match.group(1).split(",") if match else []) if v.strip()]
    return tuple(sorted(found, key=_version_key, reverse=True))


def _version_key(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def index_pick(
    requirement: str, *, python: str, runner: Runner, index_urls: tuple[str, ...] = (),
    find_links: tuple[str, ...] = (), offline: bool = False, only_binary: bool = True,
) -> IndexPick | None:
    """The file pip would install for ``requirement`` into ``python`` (None when nothing matches).

    Nothing is installed (``--dry-run``); dependencies are not resolved (``--no-deps``).

    Raises:
        InstallError: the index could not be read (unreachable, refused credentials).
    """
    installer = installer_for(python, runner=runner)
    # no --no-input: with it pip drops its "401 Error, Credentials not correct" warning, and a refused index would
    # read as an empty one (stdin is /dev/null, so pip cannot wait for a password either)
    options = ["--dry-run", "--ignore-installed", "--no-deps", "--disable-pip-version-check",
               *(["--only-binary", ":all:"] if only_binary else []), *_source_options(index_urls, find_links, offline)]
    if installer.kind == "pip":
        done = runner.run(installer.argv("install", *options, "--quiet", "--report", "-", requirement),
                          timeout_s=300)
    else:
        done = runner.run(installer.argv("install", *[o for o in options if o != "--ignore-installed"],
                                         "--reinstall", requirement), timeout_s=300)
    refused = _refused(f"look up {requirement}", installer, done)
    if refused is not None:
        raise refused
    if not done.ok:
        if "No matching distribution" in done.output or "No solution found" in done.output:
            return None
        raise _failed(f"look up {requirement}", installer, done)
    if installer.kind == "uv":
        match = re.search(r"^\s*\+\s*(\S+)==(\S+)\s*$", done.output, flags=re.MULTILINE)
        return IndexPick(name=match.group(1), version=match.group(2), url=None, sha256=None) if match else None
    report = json.loads(done.stdout)
    if not report.get("install"):
        return None
    item = report["install"][0]
    info = item.get("download_info", {})
    hashes = info.get("archive_info", {}).get("hashes", {})
    return IndexPick(name=item["metadata"]["name"], version=item["metadata"]["version"], url=info.get("url"),
                     sha256=hashes.get("sha256"))

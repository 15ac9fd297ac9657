"""Where attnforge keeps its state: ``$ATTNFORGE_HOME``, else the platform's user cache dir."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP_NAME = "attnforge"


def home_dir(environ: Mapping[str, str]) -> Path:
    """The root of the cache and state for this user.

    ``ATTNFORGE_HOME`` wins; otherwise ``platformdirs.user_cache_dir("attnforge")``
    (``~/.cache/attnforge`` on Linux, ``%LOCALAPPDATA%\\attnforge\\Cache`` on Windows).
    """
    override = environ.get("ATTNFORGE_HOME")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def leave_deleted_cwd() -> str | None:
    """Move to the filesystem root when the current directory no longer exists (a shell still sitting in a
    directory that was removed): ``Path.cwd()`` would raise ``FileNotFoundError`` and child processes (torch's
    import among them) fail in odd ways there.

    Returns:
        A note for the user when it moved (relative paths are then read from the root), else None.
    """
    try:
        os.getcwd()
    except FileNotFoundError:
        root = os.path.abspath(os.sep)
        os.chdir(root)
        return f"the current directory no longer exists; running from {root} (relative paths are read from there)"
    return None

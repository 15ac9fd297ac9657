"""Where attnforge keeps its state: ``$ATTNFORGE_HOME``, else the platform's user cache dir."""

from __future__ import annotations

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

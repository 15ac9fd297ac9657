"""attnforge.catalog and attnforge.probe import each other; entering through probe resolves the cycle."""

import attnforge.probe  # noqa: F401

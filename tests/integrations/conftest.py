"""See tests/dispatch/conftest.py: load probe before catalog (import cycle in the skeleton)."""

import attnforge.probe  # noqa: F401

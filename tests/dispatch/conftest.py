"""Import order guard: importing ``attnforge.catalog`` first hits a catalog <-> probe import cycle in the
skeleton (catalog.backends -> probe/__init__ -> probe.collect -> catalog); loading probe first avoids it."""

import attnforge.probe  # noqa: F401

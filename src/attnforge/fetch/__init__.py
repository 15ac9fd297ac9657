"""The network side of prebuilt wheels: list sources (GitHub releases, PEP 503 pages) with a cache of
listings, and download wheels with a progress bar and a hash check. Decisions stay in ``attnforge.resolve``."""

"""The network side of getting a wheel: the one HTTP client (``http.py``) and the command's network deadline
(``deadline.py``) every request attnforge makes goes through; the known sources' listings with their cache
(``listings.py``), the places the user named (``indexes.py``), and downloads with a hash check (``download.py``).
Decisions stay in ``attnforge.resolve``, which takes the listings as data."""

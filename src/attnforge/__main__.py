"""``python -m attnforge``."""

from attnforge.cli import run

run()

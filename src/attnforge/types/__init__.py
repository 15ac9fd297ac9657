"""Value types shared by several layers (a leaf package: it imports nothing from attnforge, and no torch)."""

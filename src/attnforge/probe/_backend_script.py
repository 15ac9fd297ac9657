"""Run as ``python _backend_script.py IMPORT_NAME [NATIVE ...]``: import a backend and its native modules.

Prints one JSON object. Native modules are imported directly because SageAttention and xFormers catch their
own load errors and leave a package that imports but cannot run. ``XFORMERS_MORE_DETAILS=1`` is set by the
caller so xFormers prints why its extensions did not load.
"""

import importlib
import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from typing import Any


def _last_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def main(argv: list[str]) -> None:
    import_name, natives = argv[0], argv[1:]
    out: dict[str, Any] = {"imports": None, "import_error": None, "native": [], "details": []}
    captured = io.StringIO()
    with redirect_stdout(captured), redirect_stderr(captured):
        try:
            importlib.import_module(import_name)
            out["imports"] = True
        except BaseException as exc:
            out["imports"] = False
            out["import_error"] = _last_line(exc)
        for name in natives:
            try:
                importlib.import_module(name)
                out["native"].append({"name": name, "ok": True, "error": None})
            except BaseException as exc:
                out["native"].append({"name": name, "ok": False, "error": _last_line(exc)})
    keep = ("built for", "you have", "Python", "PyTorch", "CUDA", "Error", "error", "undefined symbol")
    out["details"] = [ln.strip() for ln in captured.getvalue().splitlines() if any(k in ln for k in keep)][:12]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

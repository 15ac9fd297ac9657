#!/usr/bin/env python3
"""The prebuilt-wheel route end to end on this machine (issue 19 item 5), with no network.

1. ``attnforge cache export`` writes the wheels this machine built (the slim FlashAttention-3) as a PEP 503
   index; the FA3 wheel is taken from it.
2. A stand-in for the GitHub REST API serves, on 127.0.0.1, one release of a team repository whose asset is that
   wheel, with its size and ``digest: "sha256:..."`` as GitHub publishes them, and the asset itself.
3. ``ATTNFORGE_EXTRA_WHEEL_SOURCES`` names that repository as a ``github-releases`` source and ``GITHUB_API_URL``
   points at the stand-in. In a fresh ``ATTNFORGE_HOME`` (so no cache hit) and after ``pip uninstall``:
   ``attnforge plan flash-attn-3 --json`` must choose the wheel, and ``attnforge install flash-attn-3`` must
   download it, check its sha256 against the published digest and the SASS/PTX in its fatbins against this
   GPU, then install and verify it.
4. The same with a tampered asset (one byte changed, the published digest kept): install must refuse it.

Usage: ``python scripts/gpu/prebuilt_route.py --out route.json [--snapshot F]``. With ``--snapshot`` (another
machine's probe) only the plan is checked; that runs on a CPU machine too.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = "attnforge-team/fa3-wheels"


def serve(root: Path, releases: list[dict[str, Any]]) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == f"/repos/{REPO}/releases":
                body = json.dumps(releases if "page=2" not in self.path else []).encode()
                ctype = "application/json"
            elif path.startswith("/dl/") and (root / path[4:]).is_file():
                body, ctype = (root / path[4:]).read_bytes(), "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def run(argv: list[str], env: dict[str, str], log: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=900)
    log.append({"argv": argv, "rc": done.returncode, "seconds": round(time.monotonic() - t0, 2),
                "stdout_tail": done.stdout[-3000:], "stderr_tail": done.stderr[-3000:]})
    print(f"$ {' '.join(argv)}  -> rc={done.returncode} in {log[-1]['seconds']} s")
    print((done.stdout + done.stderr)[-1500:])
    return done


def arch_check(wheel: Path) -> str:
    """``arch check: wheel SASS sm_90a ...; device cc 9.0 -> ok`` from ``cuobjdump --list-elf`` of every .so in
    the wheel against the device's compute capability (the line the 2026-11-22 run lacked)."""
    import re
    import zipfile

    try:
        import torch

        major, minor = torch.cuda.get_device_capability()
        cc = f"sm_{major}{minor}"
    except Exception as exc:
        return f"arch check: no device ({type(exc).__name__})"
    archs: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".so"):
                path = zf.extract(name, tmp)
                try:
                    out = subprocess.run(["cuobjdump", "--list-elf", path], capture_output=True, text=True,
                                         timeout=120, check=False).stdout
                except (OSError, subprocess.TimeoutExpired) as exc:
                    return f"arch check: cuobjdump failed: {exc}"
                archs.update(re.findall(r"sm_\d+[af]?", out))
    ok = any(a.rstrip("af") == cc for a in archs)
    return f"arch check: wheel SASS {' '.join(sorted(archs)) or 'none'}; device {cc} -> {'ok' if ok else 'MISMATCH'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--snapshot", default=None, help="plan only, for the machine this probe describes")
    ap.add_argument("--wheel", default=None, help="the wheel to serve (default: the FA3 wheel from the cache)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="af-route-"))
    log: list[dict[str, Any]] = []
    env = dict(os.environ)
    if args.wheel:
        wheel = Path(args.wheel)
    else:
        run(["attnforge", "cache", "export", str(work / "export")], env, log)
        found = sorted((work / "export").rglob("flash_attn_3-*.whl"))
        if not found:
            print("no flash_attn_3 wheel in the cache export")
            Path(args.out).write_text(json.dumps({"error": "no FA3 wheel in the cache", "log": log}, indent=1))
            return 1
        wheel = found[-1]
    dl = work / "dl"
    dl.mkdir()
    shutil.copy2(wheel, dl / wheel.name)
    data = (dl / wheel.name).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    releases = [{"tag_name": "v3.0.0-team", "name": "team build", "draft": False, "prerelease": False,
                 "assets": [{"name": wheel.name, "size": len(data), "digest": f"sha256:{digest}",
                             "browser_download_url": f"PLACEHOLDER/dl/{wheel.name}"}]}]
    server, base = serve(dl, releases)
    releases[0]["assets"][0]["browser_download_url"] = f"{base}/dl/{wheel.name}"
    sources = work / "team-sources.toml"
    sources.write_text(
        "schema_version = 1\n[sources.team-fa3]\nkind = \"github-releases\"\n"
        f"repo = \"{REPO}\"\nbackends = [\"flash-attn-3\"]\ndistributions = [\"flash-attn-3\"]\n"
        "grammars = [\"flash-attn-3-mjun0812\"]\ncovers = \"this machine's own slim FA3 build, re-served\"\n"
        "sources = [\"scripts/gpu/prebuilt_route.py\"]\n")
    env.pop("ATTNFORGE_WHEEL_SOURCES", None)  # _lib.sh turns the sources off for the rest of the run
    env.update({"GITHUB_API_URL": base, "ATTNFORGE_EXTRA_WHEEL_SOURCES": str(sources),
                "ATTNFORGE_HOME": str(work / "fresh-home")})
    result: dict[str, Any] = {"wheel": wheel.name, "sha256": digest, "size": len(data), "api": base}
    if not args.snapshot:  # uninstall first: planned with FA3 installed, the plan says `installed` (issue 25 item 5)
        run([sys.executable, "-m", "pip", "uninstall", "-y", "flash-attn-3"], env, log)
        result["arch_check"] = arch_check(wheel)
        print(result["arch_check"], flush=True)
    plan_cmd = ["attnforge", "plan", "flash-attn-3", "--json"]
    if args.snapshot:
        plan_cmd += ["--snapshot", args.snapshot]
    plan = run(plan_cmd, env, log)
    try:
        doc = json.loads(plan.stdout)
        chosen = doc.get("chosen") or {}
        result["plan_chosen"] = chosen.get("description")
        result["plan_kind"] = chosen.get("kind")
        result["wheel_chosen"] = wheel.name in str(chosen.get("description"))
    except ValueError:
        result["plan_chosen"] = None
    if not args.snapshot:
        inst = run(["attnforge", "install", "flash-attn-3", "--require-hashes"], env, log)
        result["install_rc"] = inst.returncode
        result["install_seconds"] = log[-1]["seconds"]
        # tampered: same published digest, one byte changed in the served file
        bad = bytearray(data)
        bad[len(bad) // 2] ^= 0xFF
        (dl / wheel.name).write_bytes(bytes(bad))
        env["ATTNFORGE_HOME"] = str(work / "fresh-home-2")
        run([sys.executable, "-m", "pip", "uninstall", "-y", "flash-attn-3"], env, log)
        tam = run(["attnforge", "install", "flash-attn-3"], env, log)
        result["tampered_rc"] = tam.returncode
        result["tampered_refused"] = tam.returncode != 0 and "sha256" in (tam.stdout + tam.stderr)
        # put the good one back so the machine keeps a working FA3
        (dl / wheel.name).write_bytes(data)
        env["ATTNFORGE_HOME"] = str(work / "fresh-home-3")
        run(["attnforge", "install", "flash-attn-3", "--no-verify"], env, log)
    server.shutdown()
    result["log"] = log
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "log"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

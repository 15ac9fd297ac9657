"""Built wheels named and pinned like the community's: a local version label with the torch, CUDA, C++ ABI
and arch set they were built for, and ``Requires-Dist: torch==X.Y.*`` in their metadata.

The label grammar (PEP 440 local version: lowercase alphanumerics separated by periods)::

    label   = variant "torch" MAJOR "." MINOR [ ".cxx11abi" ("true" | "false") ] [ "." archs ]
    variant = "cu" DIGITS        (torch's CUDA, 13.0 -> cu130)  |  "cpu"
    archs   = ( "sm" DIGITS )+   (compute capabilities, 8.0 and 9.0 -> sm80sm90)

e.g. ``2.8.3+cu130torch2.11.cxx11abitrue.sm80sm90``. FlashAttention's own release wheels use the same idea
(``flash_attn-2.8.3+cu12torch2.4cxx11abiFALSE-...whl``, https://github.com/Dao-AILab/flash-attention/releases),
so two builds of one version for two torch versions get two file names, and an export keeps both.

The torch pin is what stops pip and uv from installing the wheel into another torch: a torch extension is
bound to the torch minor version it was compiled against (its C++ ABI changes between minors). ``==2.11.*``
matches ``2.11.0+cu130`` (PEP 440 ignores a candidate's local label for a specifier without one).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.errors import UsageError
from attnforge.types.local_label import LocalLabel as LocalLabel  # noqa: PLC0414 - the label grammar, re-exported


def label_wheel(wheel: Path, label: LocalLabel, dest_dir: Path, *,
                dist_info_files: dict[str, bytes] | None = None) -> Path:
    """Write ``wheel`` again into ``dest_dir`` as ``<name>-<version>+<label>-<tags>.whl``, with its metadata
    version set to match, ``Requires-Dist: torch==X.Y.*`` (replacing any torch requirement) and a RECORD
    whose hashes and sizes are recomputed. A wheel that already carries a local label is refused.

    ``dist_info_files``: extra files for the ``.dist-info`` directory by name (e.g. a slim build's
    :data:`attnforge.cache.capabilities.CAPABILITIES_FILE`), so they travel with the wheel to any index and are
    readable after install through ``importlib.metadata``'s ``Distribution.read_text``.

    Raises:
        UsageError: not a wheel, or its version already has a local label.
    """
    name, version, _, _ = parse_wheel_filename(wheel.name)
    if version.local is not None:
        raise UsageError(f"{wheel.name} already has a local version label (+{version.local})")
    new_version = f"{version.public}+{label}"
    old_stem = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
    new_stem = f"{canonicalize_name(name).replace('-', '_')}-{new_version}"
    out = dest_dir / (new_stem + wheel.name[len(old_stem):])
    with zipfile.ZipFile(wheel) as zin:
        infos = zin.infolist()
        old_info = next((i.filename.split("/")[0] for i in infos if i.filename.endswith(".dist-info/METADATA")
                         and i.filename.count("/") == 1), None)
        if old_info is None:
            raise UsageError(f"{wheel.name} has no *.dist-info/METADATA")
        new_info = f"{new_stem}.dist-info"
        files: list[tuple[zipfile.ZipInfo, bytes]] = []
        for info in infos:
            if info.is_dir() or info.filename == f"{old_info}/RECORD":
                continue
            data = zin.read(info)
            arcname = info.filename
            if arcname.startswith(old_info + "/"):
                arcname = new_info + arcname[len(old_info):]
                if arcname == f"{new_info}/METADATA":
                    data = _pinned_metadata(data, new_version, label.torch_requirement)
            clone = zipfile.ZipInfo(arcname, date_time=info.date_time)
            clone.external_attr, clone.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
            files.append((clone, data))
        for extra, data in (dist_info_files or {}).items():
            if "/" in extra or extra in ("RECORD", "METADATA", "WHEEL"):
                raise UsageError(f"{extra!r} cannot be added to a wheel's .dist-info")
            added = zipfile.ZipInfo(f"{new_info}/{extra}", date_time=(1980, 1, 1, 0, 0, 0))
            added.external_attr, added.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
            files = [(i, d) for i, d in files if i.filename != added.filename] + [(added, data)]
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for info, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([info.filename, f"sha256={digest}", len(data)])
    writer.writerow([f"{new_info}/RECORD", "", ""])
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "x", compression=zipfile.ZIP_DEFLATED) as zout:
        for info, data in files:
            zout.writestr(info, data)
        zout.writestr(f"{new_info}/RECORD", record.getvalue())
    tmp.replace(out)
    return out


def _pinned_metadata(data: bytes, version: str, torch_requirement: str) -> bytes:
    """METADATA with ``Version`` replaced and the torch requirement set (headers only; the body is kept)."""
    head, sep, body = data.partition(b"\n\n")
    out: list[str] = []
    for line in head.decode("utf-8").splitlines():
        key = "" if line[:1].isspace() else line.split(":", 1)[0].strip().lower()  # not a continuation line
        if key == "version":
            out.append(f"Version: {version}")
            continue
        if key == "requires-dist" and canonicalize_name(re.split(r"[\s<>=!~;\[(]", line.split(":", 1)[1].strip(),
                                                                   maxsplit=1)[0]) == "torch":
            continue
        out.append(line)
    out.append(f"Requires-Dist: {torch_requirement}")
    return ("\n".join(out) + "\n").encode("utf-8") + (sep + body if sep else b"")

"""Built wheels carry a local label naming their torch/CUDA/ABI/archs and pin torch in their metadata, so two
builds of one version export side by side and pip refuses the one built for another torch.

pip's refusal is checked for real: ``pip --python VENV install --dry-run --no-index`` into a fresh venv that
holds a stand-in ``torch`` distribution (a dist-info with METADATA only), never the real torch.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from attnforge.cache import Store
from attnforge.cache.label import LocalLabel, label_wheel
from attnforge.cache.share import export
from attnforge.errors import UsageError
from tests.cache.conftest import inputs_for
from tests.cache.wheelmaker import make_wheel

TAG = "cp311-cp311-linux_x86_64"


@pytest.mark.parametrize("text", [
    "cu130torch2.11", "cputorch2.13", "cu128torch2.8.cxx11abitrue", "cu130torch2.11.cxx11abifalse.sm80sm90",
    "cu126torch2.10.sm100sm120",
])
def test_label_round_trips(text: str) -> None:
    assert str(LocalLabel.parse(text)) == text
    assert str(LocalLabel.parse(text.upper())) == text


def test_label_fields() -> None:
    label = LocalLabel.for_torch("2.11.0+cu130", "13.0", True, ((9, 0), (8, 0), (9, 0)))
    assert str(label) == "cu130torch2.11.cxx11abitrue.sm80sm90"
    assert label.torch_requirement == "torch==2.11.*"
    assert LocalLabel.parse("cu130torch2.11").cuda == "13.0"


@pytest.mark.parametrize("bad", ["cu130", "torch2.11", "cu130torch2", "cu130torch2.11.sm", "cu130torch2.11+x", ""])
def test_label_rejects_text_outside_the_grammar(bad: str) -> None:
    with pytest.raises(ValueError, match="not an attnforge local version label"):
        LocalLabel.parse(bad)


def _labelled(tmp_path: Path, torch: str) -> Path:
    raw = make_wheel(tmp_path / f"raw{torch}", tag=TAG, requires=["torch>=2.0"])
    label = LocalLabel.for_torch(f"{torch}.0+cu130", "13.0", True, ((9, 0),))
    out = tmp_path / "labelled"
    out.mkdir(exist_ok=True)
    return label_wheel(raw, label, out)


def test_a_labelled_wheel_has_its_name_metadata_and_a_correct_record(tmp_path: Path) -> None:
    wheel = _labelled(tmp_path, "2.11")
    assert wheel.name == f"af_pure_fixture-0.1.0+cu130torch2.11.cxx11abitrue.sm90-{TAG}.whl"
    info = "af_pure_fixture-0.1.0+cu130torch2.11.cxx11abitrue.sm90.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = zf.read(f"{info}/METADATA").decode()
        record = list(csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode())))
        assert {row[0] for row in record} == names
        for path, digest, size in record:
            if path.endswith("RECORD"):
                continue
            data = zf.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
    assert "Version: 0.1.0+cu130torch2.11.cxx11abitrue.sm90" in meta
    assert "Requires-Dist: torch==2.11.*" in meta and "torch>=2.0" not in meta


def test_two_builds_for_two_torches_export_side_by_side(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    for torch in ("2.11", "2.12"):
        wheel = _labelled(tmp_path / torch, torch)
        store.put(wheel, inputs_for(wheel, torch_version=f"{torch}.0+cu130"))
    result = export(store, tmp_path / "out")
    assert len(result.exported) == 2 and result.skipped == () and result.errors == ()
    page = (tmp_path / "out" / "simple" / "af-pure-fixture" / "index.html").read_text()
    assert "torch2.11" in page and "torch2.12" in page


def _venv_with_stand_in_torch(path: Path, version: str) -> str:
    venv.create(path, system_site_packages=False, with_pip=False)  # isolated on purpose: a stand-in torch only
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    info = Path(purelib) / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "INSTALLER").write_text("test\n")
    (info / "RECORD").write_text("")
    return str(python)


def _pip_dry_run(python: str, links: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--no-index", "--find-links",
         str(links), "af-pure-fixture"],
        capture_output=True, text=True, timeout=300, check=False,
    )


@pytest.mark.integration
def test_pip_refuses_the_build_for_another_torch_and_picks_the_matching_one(tmp_path: Path) -> None:
    assert sysconfig.get_paths()["purelib"]  # the real torch is never touched: the venv below is fresh
    python = _venv_with_stand_in_torch(tmp_path / "venv", "2.12.0+cu130")
    links = tmp_path / "labelled"
    _labelled(tmp_path, "2.11")
    refused = _pip_dry_run(python, links)
    assert refused.returncode != 0
    assert "torch==2.11.*" in refused.stdout + refused.stderr
    _labelled(tmp_path, "2.12")
    chosen = _pip_dry_run(python, links)
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    assert "af-pure-fixture-0.1.0+cu130torch2.12" in chosen.stdout


def test_the_installer_labels_binary_builds_and_leaves_pure_wheels_alone(tmp_path: Path) -> None:
    from attnforge.install.guards import pinned_to_torch
    from attnforge.probe.snapshot import SystemSnapshot
    from attnforge.resolve.types import BuildSpec, SourceKind, SourceSpec
    from tests.conftest import REPO

    snapshot = SystemSnapshot.load(REPO / "tests" / "fixtures" / "snapshots" / "cpu_dev_torch2.13_cpu.json")
    spec = BuildSpec(name="af-pure-fixture", version=None, source=SourceSpec(kind=SourceKind.PATH, location="x"),
                     archs=((9, 0),), max_jobs=1, nvcc_threads=1)
    binary = pinned_to_torch(make_wheel(tmp_path / "b", tag=TAG), spec, snapshot)
    assert binary.name == f"af_pure_fixture-0.1.0+cputorch2.13.cxx11abitrue.sm90-{TAG}.whl"
    pure = make_wheel(tmp_path / "p")
    assert pinned_to_torch(pure, spec, snapshot) == pure


def test_a_slim_wheels_capabilities_travel_inside_it_to_a_plain_pip_install(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A slim build exported to an index and installed by plain pip elsewhere (no attnforge cache entry, no
    direct_url to one) still says what it can run: the capabilities are a file of its .dist-info."""
    from attnforge.cache.capabilities import CAPABILITIES_FILE, capabilities_file, installed_capabilities
    from attnforge.catalog.slim import Capabilities

    caps = Capabilities(head_dims=(128,), dtypes=("bfloat16",), backward=False, features=("varlen",))
    raw = make_wheel(tmp_path / "raw", tag=TAG, requires=["torch>=2.0"])
    label = LocalLabel.for_torch("2.11.0+cu130", "13.0", True, ((9, 0),))
    (tmp_path / "index").mkdir()
    wheel = label_wheel(raw, label, tmp_path / "index", dist_info_files=capabilities_file(caps))
    with zipfile.ZipFile(wheel) as zf:
        record = {row[0] for row in csv.reader(io.StringIO(zf.read(next(
            n for n in zf.namelist() if n.endswith("/RECORD"))).decode()))}
        assert any(n.endswith(f".dist-info/{CAPABILITIES_FILE}") for n in record)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(site), str(wheel)], check=True)
    monkeypatch.syspath_prepend(str(site))
    assert installed_capabilities(["af-pure-fixture"]) == caps
    with pytest.raises(UsageError, match="cannot be added"):
        label_wheel(raw, label, tmp_path, dist_info_files={"RECORD": b""})

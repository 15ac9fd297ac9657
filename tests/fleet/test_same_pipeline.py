"""``fleet plan`` plans every kind with ``attnforge plan``'s own pipeline (``install.inputs.assemble``): on the same
snapshot it takes the same route, for every requirement form ``plan`` takes; a prebuilt wheel wins exactly where
``plan`` takes it. In-process (``main``), on the recorded snapshots, offline: no Ray is started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from attnforge.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SNAPSHOTS = sorted((FIXTURES / "snapshots").glob("*.json"))
WHEELS = FIXTURES / "wheels" / "h200_flash_attn"

#: The requirement forms ``attnforge plan`` takes (an alias, specifiers, case), shared by both verbs below.
FORMS = ("flash_attn", "flash-attn", "flash-attn>=2.7", "FLASH-ATTN==2.8.3", "flash-attn<2.8",
         "flash-attn-3", "sageattention")
#: Option sets both verbs take (the prebuilt wheels of the fixture directory; a forced build; --arch).
OPTIONS = {
    "find-links": ["--find-links", str(WHEELS), "--offline"],
    "from-source+arch": ["--from-source", "--arch", "8.0,9.0"],
}


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out)


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("form", FORMS)
def test_fleet_plan_takes_the_route_plan_takes_on_the_same_snapshot(
        form: str, options: str, capsys: pytest.CaptureFixture[str]) -> None:
    snaps = [a for s in SNAPSHOTS for a in ("--snapshot", str(s))]
    rc, fleet = _json(["fleet", "plan", form, *OPTIONS[options], *snaps, "--json"], capsys)
    assert rc in (0, 1)
    routes = {r["kind"]: r for r in fleet["routes"]}
    builds = {b["number"]: b for b in fleet["builds"]}
    for kind in fleet["kinds"]:
        route = routes[kind["id"]]
        plans = [_json(["plan", form, *OPTIONS[options], "--snapshot", n["address"], "--json"], capsys)[1]
                 for n in kind["nodes"]]
        if not kind["kind"]["ccs"]:
            assert route["route"] == "skipped"  # a GPU-less kind is no target (and no failure)
            continue
        # a kind's nodes may differ in toolchain: the fleet takes the first node whose plan is viable
        chosen = next((p["chosen"] for p in plans if p["chosen"]), None)
        if chosen is None:  # nothing on its own nodes; another kind's build of its wheel key may serve it
            assert route["route"] in ("none", "build"), (kind["describe"], route)
            if route["route"] == "build":
                assert builds[route["build"]]["builder"] != kind["id"]
        elif chosen["kind"] == "source":
            assert route["route"] == "build", (kind["describe"], route)
            assert kind["id"] in builds[route["build"]]["kinds"]
        else:
            assert (route["route"], route["detail"]) == (chosen["kind"], chosen["description"]), kind["describe"]


def test_a_prebuilt_wheel_wins_on_the_kind_it_fits_and_a_build_serves_the_rest(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The H200 (torch 2.11, cu130, cp312) kind takes the fixture wheel; the H100 (torch 2.8) kind has none and
    plans a build, as `attnforge plan` does on each."""
    h200, h100 = (FIXTURES / "snapshots" / f for f in ("h200_torch2.11_cu130.json", "h100_torch2.8_cu128.json"))
    _, doc = _json(["fleet", "plan", "flash_attn", "--find-links", str(WHEELS), "--snapshot", str(h200),
                    "--snapshot", str(h100), "--json"], capsys)
    by_node = {n["address"]: k["id"] for k in doc["kinds"] for n in k["nodes"]}
    routes = {r["kind"]: r for r in doc["routes"]}
    assert routes[by_node[str(h200)]]["route"] == "wheel"
    assert "cu13torch2.11" in routes[by_node[str(h200)]]["detail"]
    assert routes[by_node[str(h100)]]["route"] != "wheel"


def test_an_unknown_name_is_bad_input_as_in_plan(capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(SNAPSHOTS[0])
    assert main(["fleet", "plan", "flash-atn", "--snapshot", snap]) == 2
    assert "unknown backend" in capsys.readouterr().err

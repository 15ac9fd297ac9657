"""The front door for getting a kernel onto a machine: request -> plan -> obtain (cache | prebuilt wheel | build)
-> place (pip/uv) -> verify, as functions with typed inputs and results.

``attnforge plan``, ``build`` and ``install`` are each "parse -> one call here -> render":

- :func:`attnforge.provision.plan.plan`: the plan ``install`` would execute, with each route's expected time
  (this machine's recorded builds of the project first, the catalog's figure only when there is none).
- :func:`attnforge.provision.build.prepare` then :func:`attnforge.provision.build.build`: a source build into the
  cache, keyed and labelled by :func:`attnforge.install.keys.store_built` (the one artifact room).
- :func:`attnforge.provision.install.install`: the whole pipeline into an interpreter.

The stages live below (``install/``, ``build/``, ``resolve/``, ``cache/``, ``fetch/``); the command line reaches them
only through this package (``tests/test_architecture.py`` enforces it).
"""

from __future__ import annotations

from attnforge.install.inputs import RequestArgs as RequestArgs
from attnforge.install.inputs import catalog_requirement as catalog_requirement
from attnforge.install.inputs import parse_requirement as parse_requirement

__all__ = ["RequestArgs", "catalog_requirement", "parse_requirement"]

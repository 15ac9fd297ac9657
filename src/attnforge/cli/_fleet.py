"""What every ``attnforge fleet`` verb shares: the cluster options (``--address``, ``--nodes``, ``--exclude-head``),
the connection (Ray's output kept off stdout under ``--json``), the selected nodes, and the progress lines."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def head_home() -> Path:
    from attnforge._system.paths import home_dir

    return home_dir(os.environ)


def address_option(func: F) -> F:
    return click.option("--address", default=None, metavar="HOST:PORT",
                        help="The Ray cluster's head (HOST:PORT, ray://HOST:10001 or auto); default: start a "
                             "local one-node Ray.")(func)


def node_options(func: F) -> F:
    """``--nodes LABEL=VALUE`` and ``--exclude-head``: which of the cluster's nodes a verb works on."""
    options = [
        click.option("--nodes", "node_labels", multiple=True, metavar="LABEL=VALUE",
                     help="Only nodes whose Ray label LABEL is VALUE (e.g. ray.io/accelerator-type=H100; repeat: "
                          "all must hold)."),
        click.option("--exclude-head", is_flag=True, help="Leave the Ray head node out."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@contextmanager
def cluster(address: str | None, as_json: bool = False) -> Iterator[Any]:
    """The connected ``ray`` module. Under ``--json`` everything Ray prints on this process's stdout (worker
    output, worker and node deaths) goes to stderr instead, so stdout carries only the JSON document."""
    import sys
    from contextlib import ExitStack, redirect_stdout

    from attnforge.fleet.cluster import connect

    with ExitStack() as stack:
        if as_json:
            stack.enter_context(redirect_stdout(sys.stderr))
        ray = connect(address, log_to_driver=True)
        try:
            yield ray
        finally:
            if address is None:
                ray.shutdown()


def selected_nodes(ray: Any, opts: dict[str, Any] | None = None, *, fresh: bool = False) -> list[Any]:
    """The selected alive nodes (``--nodes``, ``--exclude-head``), probing only the ones not remembered (or all
    with ``fresh``); problems go to stderr."""
    from attnforge.fleet.cluster import Selection, probe_nodes
    from attnforge.fleet.state import load_nodes, save_nodes

    opts = opts or {}
    selection = Selection.parse(opts.get("node_labels", ()), exclude_head=opts.get("exclude_head", False))
    root = head_home()
    known = load_nodes(root)
    found, problems = probe_nodes(ray, known=() if fresh else known, selection=selection)
    for p in problems:
        click.echo(f"warning: {p}", err=True)
    save_nodes(root, found, known=known)
    return found


def check_backend_names(backends: tuple[str, ...], source: str | None, *, example: str) -> None:
    """Refuse (exit 2) a fleet request without a backend, or with a name the catalog does not know (an id or an
    alias, as ``attnforge plan`` takes them), before Ray starts (a local one takes seconds and prints its banner)
    or any node is asked. A ``--source`` build's name is free. ``example``: the command the hint shows.

    Raises:
        UsageError: no backend and no source; an unknown backend (the hint names the closest known one).
    """
    if source is not None:
        return
    from attnforge.catalog import load_catalog
    from attnforge.errors import UsageError
    from attnforge.provision import catalog_requirement

    if not backends:
        raise UsageError("name at least one backend", hint=example)
    catalog = load_catalog()
    for text in backends:
        catalog_requirement(text, catalog)  # an alias (flash_attn) is fine: each node's request takes it too


def say(line: str) -> None:
    click.echo(line, err=True)

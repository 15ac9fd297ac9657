"""The error tree (attnforge.errors): what every error keeps, wherever it goes."""

from __future__ import annotations

import pickle

from attnforge.errors import CatalogError, DispatchError


def test_an_attnforge_error_keeps_its_fields_through_pickle() -> None:
    """Errors cross process boundaries (Ray tasks, the isolated subprocesses): ``args``, ``message``, ``cause``,
    ``hint`` and a subclass's own fields survive pickling, a message passed by keyword included (``__init__`` sets
    ``args`` itself: it cannot call ``BaseException.__init__``, which torch.compile's Dynamo does not trace)."""
    error = pickle.loads(pickle.dumps(DispatchError(message="m", cause="c", hint="h")))  # noqa: S301 - our own bytes
    assert (type(error), error.args, error.message, error.cause, error.hint) == (DispatchError, ("m",), "m", "c", "h")
    assert str(error) == "m\ncause: c\nhint: h"
    assert repr(error) == "DispatchError('m')"
    catalog = pickle.loads(pickle.dumps(CatalogError("bad", problems=("a.b",), hint="fix")))  # noqa: S301 - ours
    assert (catalog.args, catalog.problems, catalog.hint) == (("bad",), ("a.b",), "fix")

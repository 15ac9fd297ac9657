"""Measurement off the calling thread: one worker thread per process runs the first-use measurements
(:mod:`attnforge.dispatch.autotune`), so no call waits for a candidate's compile (FA4's JIT, Flex's
``torch.compile``: up to 13 s a class on an H100, issue 30) or for its timing.

A job is a function; the worker runs jobs one at a time, in the order they came. Between the steps of a job
(one candidate's timed round) it passes :meth:`Worker.checkpoint`, where it waits while someone holds it
(:meth:`Worker.hold`: code about to capture a CUDA graph, which another thread's synchronize would invalidate,
holds it for the capture). :meth:`Worker.wait` blocks until every job submitted so far is done (the end of an
``autotune`` context, ``attnforge warmup``, tests).

On a GPU the job runs on its own CUDA stream (:func:`stream_scope`), on copies of the caller's tensors made on
the caller's stream before it was queued, and synchronizes that stream only, never the device.
"""

from __future__ import annotations

import atexit
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from attnforge.dispatch.features import one_line

#: a queued measurement: runs on the worker thread; ``checkpoint`` is called between its steps
Job = Callable[[Callable[[], None]], None]


class Worker:
    """A lazily started daemon thread that runs :data:`Job` s in order (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Hashable, Job]] = deque()
        self._pending: set[Hashable] = set()
        self._holds = 0
        self._busy = False
        self._thread: threading.Thread | None = None
        self._closed = False
        #: the jobs that raised (their key and error's first line), for explain and tests
        self.failed: list[tuple[Hashable, str]] = []

    def submit(self, key: Hashable, job: Job) -> bool:
        """Queue ``job`` unless a job of ``key`` is queued or running; True when queued."""
        with self._cond:
            if key in self._pending or self._closed:
                return False
            self._pending.add(key)
            self._jobs.append((key, job))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="attnforge-autotune", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            self._cond.notify_all()
            return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Drop the queued jobs and wait (at most ``timeout_s``) for the running one, so the interpreter never
        finalizes while the worker is inside CUDA or a JIT compiler (on an H100 that aborted the process with
        ``terminate called without an active exception``). Registered with :mod:`atexit` when the worker starts;
        later submissions are refused."""
        with self._cond:
            self._closed = True
            for key, _job in self._jobs:
                self._pending.discard(key)
            self._jobs.clear()
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._busy, timeout=timeout_s)

    def pending(self, key: Hashable) -> bool:
        """Whether a job of ``key`` is queued or running."""
        with self._cond:
            return key in self._pending

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every job submitted so far is done; False when ``timeout_s`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout=timeout_s)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """No measurement step runs inside this context: it waits for the running step to finish (a step is
        one candidate's round, or its first call, which may compile), and the worker waits at its next
        checkpoint until the context ends."""
        with self._cond:
            self._holds += 1
            self._cond.wait_for(lambda: not self._busy or threading.current_thread() is self._thread)
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    def checkpoint(self) -> None:
        """Called by a job between its steps: waits while the worker is held."""
        with self._cond:
            if not self._holds:
                return
            self._busy = False
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._holds)
            self._busy = True

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs) and not self._holds)
                key, job = self._jobs.popleft()
                self._busy = True
            try:
                job(self.checkpoint)
            except Exception as exc:  # a job must never kill the worker
                self.failed.append((key, one_line(exc)))
            finally:
                with self._cond:
                    self._busy = False
                    self._pending.discard(key)
                    self._cond.notify_all()


WORKER = Worker()


def stream_scope(device: Any) -> tuple[Any, Callable[[], None]]:
    """A context that runs CUDA work of the worker on its own stream of ``device`` (a null context on a CPU),
    and the function that waits for that stream only."""
    if getattr(device, "type", None) != "cuda":
        return nullcontext(), lambda: None
    import torch

    stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]

    @contextmanager
    def scope() -> Iterator[None]:
        with torch.cuda.device(device), torch.cuda.stream(stream):
            yield

    return scope(), stream.synchronize


def snapshot(tensors: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
    """Copies of the caller's tensors, made on the caller's stream, with the event the worker's stream waits on
    before it reads them (None on a CPU): the caller may overwrite or free its own tensors meanwhile (a KV cache
    updated in place)."""
    import torch

    copies = tuple(t.detach().clone(memory_format=torch.preserve_format) for t in tensors)
    if copies and copies[0].device.type == "cuda":
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return copies, event
    return copies, None

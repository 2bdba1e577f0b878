"""SIGTERM and SIGINT stop a run cleanly: workers stopped, MLflow run closed as KILLED, lock released.

While :func:`stop_on_signals` is active, either signal raises :class:`~fastvocab.pipeline.errors.Interrupted`
in the main thread; the driver's ``finally`` blocks then do the cleanup and the CLI exits with 143 (SIGTERM)
or 130 (SIGINT). Everything already written is complete (atomic writes), so the next run resumes. Ray's
``ray.init`` installs its own SIGTERM handler (``sys.exit``, which ends in a native crash dump mid-call), so
the Ray session calls :func:`reinstall` after starting Ray.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from fastvocab.pipeline.errors import Interrupted

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state: dict[str, object] = {"active": False, "stopping": False, "signum": None}


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state["stopping"]:
        # already cleaning up: a second signal must not abort the cleanup halfway (the lock, the MLflow run)
        log.warning("%s received again: still stopping, please wait", signal.Signals(signum).name)
        return
    _state.update(stopping=True, signum=signum)
    log.warning("%s received: stopping the workers; the next run resumes", signal.Signals(signum).name)
    raise Interrupted(signum)


def received() -> int | None:
    """The signal that is stopping the run, if any.

    An exception raised by a signal handler while Ray's Cython code waits (``ray.wait``) comes out as a
    ``SystemError`` ("returned a result with an exception set"); the Ray session turns it back into
    :class:`Interrupted` with this.
    """
    return _state["signum"] if _state["stopping"] else None  # type: ignore[return-value]


def reinstall() -> None:
    """Put our handlers back (after a library replaced them); a no-op outside :func:`stop_on_signals`."""
    if _state["active"] and threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _handler)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Interrupted` for the block (main thread only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread() or _state["active"]:
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _state.update(active=True, stopping=False, signum=None)
    try:
        for sig in SIGNALS:
            signal.signal(sig, _handler)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state.update(active=False, stopping=False, signum=None)

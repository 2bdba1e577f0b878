"""Beam search's compiled CPU functions (``fastvocab.decoding.host_beam_step``, numba), imported on first use
and loaded once per process before the first beam search on CPU (:func:`prepare_compiled_step`)."""

from __future__ import annotations

import sys
import threading


def compiled_step():
    """``fastvocab.decoding.host_beam_step``, imported on first use: numba takes ~0.4 s to import, and only
    beam search on CPU needs it."""
    from fastvocab.decoding import host_beam_step

    return host_beam_step


_PREPARED = False
_PREPARING = threading.Lock()


def prepare_compiled_step() -> None:
    """Load beam search's compiled CPU functions (``host_beam_step.warm``) once per process, before the
    first beam search on CPU, so that the processes a decode pool forks after it inherit them. Where numba's
    cache holds no machine code for them (the first run on a machine, or after their source changed), one
    line on standard error says that the next ~10 s are spent compiling them, and where they are then kept;
    where numba can cache nothing, that every process compiles them. A warm cache loads them in under a
    second, silently."""
    global _PREPARED
    if _PREPARED:
        return
    with _PREPARING:
        if _PREPARED:
            return
        step = compiled_step()
        state, folder = step.cache_state()
        if state == step.COLD:
            print(
                f"compiling the beam search's CPU kernels (once per machine, ~10 s; cached in {folder})",
                file=sys.stderr,
                flush=True,
            )
        elif state == step.UNCACHED:
            print(
                "compiling the beam search's CPU kernels (~10 s; numba has no writable cache folder here, so "
                "every process compiles them: set NUMBA_CACHE_DIR to keep them)",
                file=sys.stderr,
                flush=True,
            )
        step.warm()
        _PREPARED = True

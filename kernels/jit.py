"""``njit``: numba's compiler for the CPU step's small functions (``decoding/host_beam_step.py``,
``kernels/host_moments.py``), its machine code kept on disk where a cache folder can be written.

numba caches beside the module, else in its user cache folder (``NUMBA_CACHE_DIR`` sets another); where
neither can be written (a read-only install and home), it refuses ``cache=True`` outright, so the functions
are then compiled in each process instead (~10 s at its first beam step). Before the first beam search of a
process ``decoding.beam_kernels.prepare_compiled_step`` loads them, and says so in one line on standard error
when it has to compile them (``host_beam_step.cache_state``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba


def njit(**options: Any) -> Callable[[Callable], Callable]:
    """``numba.njit(cache=True, nogil=True, **options)``, without the cache where numba has none."""

    def compile_(fn: Callable) -> Callable:
        try:
            return numba.njit(cache=True, nogil=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(nogil=True, **options)(fn)

    return compile_

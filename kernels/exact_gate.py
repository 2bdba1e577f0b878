"""When the exactness certificate pays for itself, measured while decoding (:class:`ExactGate`).

With ``exact_k`` a clustered step is exact either way: the map's columns with the certificate (rows it cannot
vouch for get every column), or every column at once. The first costs about ``u``, the map's share of the
work (its columns and the nearest-centroid search, ``r`` columns' worth, per row over N), plus all N
columns for the share ``1 - c`` of rows left uncertified; so it pays only when ``c > u``. Where the bound is
loose (few rows certified) the certificate step costs more than the full projection, and the gate sends
steps to the full one. The choice changes the time only, never an output.
"""

from __future__ import annotations

import threading

WARMUP_CALLS = 8  # certificate steps before the gate decides
# While the full step is chosen the certificate is measured again after PROBE_EVERY calls, then after twice
# as many each time it still does not pay, up to MAX_PROBE_EVERY: a probe costs a certificate step that
# does not pay, so on a long run they cost next to nothing.
PROBE_EVERY = 32
MAX_PROBE_EVERY = 1024


class ExactGate:
    """Counts what the certificate steps certify and compute, and picks the step for each call.

    ``n_vocab``: N; ``search_columns``: the nearest-centroid search's cost in columns a row (``r``). The
    counts are cumulative over the certificate steps run (the first :data:`WARMUP_CALLS`, then the probes).
    """

    def __init__(self, n_vocab: int, search_columns: int) -> None:
        self.n_vocab = n_vocab
        self.search_columns = search_columns
        self.calls = 0
        self.interval = PROBE_EVERY
        self.next_probe = WARMUP_CALLS + PROBE_EVERY
        self.rows = 0
        self.certified = 0
        self.columns = 0  # the map's columns, summed over the rows of the certificate steps
        self._lock = threading.Lock()  # one projection may serve several worker threads

    def full_step(self) -> bool:
        """Whether this call should compute every column instead of running the certificate."""
        with self._lock:
            self.calls += 1
            if self.calls <= WARMUP_CALLS:
                return False
            if self.pays():
                self.interval = PROBE_EVERY
                self.next_probe = self.calls + PROBE_EVERY
                return False
            if self.calls >= self.next_probe:  # measure the certificate again
                self.next_probe = self.calls + self.interval
                self.interval = min(2 * self.interval, MAX_PROBE_EVERY)
                return False
            return True

    def pays(self) -> bool:
        """``c > u`` over the certificate steps so far (True before any)."""
        if not self.rows:
            return True
        certified = self.certified / self.rows
        share = (self.columns / self.rows + self.search_columns) / self.n_vocab
        return certified > share

    def record(self, rows: int, certified: int, columns: int) -> None:
        """A certificate step: its rows, those certified, and the map's columns it computed (all rows)."""
        with self._lock:
            self.rows += rows
            self.certified += certified
            self.columns += columns

"""Whether a clustered int8 step of many rows costs more than the full int8 GEMM on this machine, measured.

The cost tables (``union_costs``) price the two union kernels alone; a step of many rows also pays the
centroid assignment, the union's bookkeeping, one input quantisation and library call per dense block of the
popularity order, and the inactive-mass estimate. Where the dense GEMM over all N is fast (ONNX Runtime's
AMX kernels on a Xeon), those decide: on a 2-core Xeon with AMX at the demo model's shape (d 256, N 32,108)
the tables kept the map, and clustered int8 ran 0.85x full int8 at greedy batch 32 (docs/cpu-engine.md, 0028).

:func:`probe` times the projection's own map step and its full int8 step at ``PROBE_ROWS`` rows, drawn as
decoding draws them (each row a centroid, clusters in proportion to their population), in interleaved
rounds, and keeps the medians under ``probes/`` in the cache folder, keyed by the machine
(``gemm_probe.machine_key``) and the map; a later process reads them. A step of many rows then skips the map
where it measured slower (:meth:`MapStepProbe.skips`). Both paths give the full int8 layer's logits on their
columns, so the answer changes which columns a step computes, never how one is computed. The probe is
measured once, in the process that builds the projection, before any decoding worker forks from it, so every
worker of a run decides alike. ``FASTVOCAB_MAP_PROBE=off`` (``switches.MAP_PROBE``) leaves the choice to the
cost tables.
"""

from __future__ import annotations

import bisect
import datetime as dt
import hashlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from fastvocab import switches
from fastvocab.kernels import gemm_probe
from fastvocab.kernels.cluster_assign import PreparedMap

log = logging.getLogger(__name__)

PROBE_ROWS = (16, 32, 64, 128)  # from ORT_MIN_ROWS: a greedy batch of 16-128, a beam-4 batch of 4-32
ROUNDS = 5
CALLS = 3  # steps per path and round, timed together


@dataclass(frozen=True)
class MapStepProbe:
    """The two steps' times at each probed row count (microseconds a step, medians of the rounds)."""

    rows: tuple[int, ...]
    map_us: tuple[float, ...]
    full_us: tuple[float, ...]
    measured: str  # when, ISO date-time
    cached: bool = False

    def skips(self, rows: int) -> bool:
        """Whether a step of ``rows`` rows skips the map: it measured slower at the largest probed row
        count at or below ``rows`` (none below the first)."""
        i = bisect.bisect_right(self.rows, rows) - 1
        return i >= 0 and self.map_us[i] > self.full_us[i]

    def describe(self) -> str:
        where = "cached" if self.cached else "measured now"
        times = zip(self.rows, self.map_us, self.full_us, strict=True)
        steps = ", ".join(f"{r} rows {m:.0f} / {f:.0f} us" for r, m, f in times)
        return f"map step / full int8 step ({where}, {self.measured}): {steps}"


def probe_map_steps(
    pm: PreparedMap,
    options: dict[str, object],
    n_vocab: int,
    map_step: Callable[[torch.Tensor], object],
    full_step: Callable[[torch.Tensor], object],
) -> MapStepProbe:
    """:func:`probe` of a projection over the prepared map ``pm``: its steps on rows at centroids drawn by the
    clusters' populations, keyed by the map's sets, the projection's ``options`` and N; logged with where the
    map is skipped (``fastvocab -v translate`` shows it)."""
    population = pm.population.astype(np.float64)
    share = population / population.sum() if population.sum() > 0 else None  # None: uniform
    centroids = pm.centroids_t.T.float()

    def sample(rows: int) -> torch.Tensor:
        drawn = np.random.default_rng(0).choice(pm.r, size=rows, p=share)
        return centroids[torch.from_numpy(drawn)].contiguous()

    digest = hashlib.sha256(pm.indptr.cpu().numpy().tobytes())
    digest.update(repr(sorted(options.items())).encode())
    digest.update(f"N={n_vocab}".encode())
    found = probe(centroids.shape[1], digest.hexdigest()[:20], map_step, full_step, sample)
    skipped = [r for r in found.rows if found.skips(r)]
    where = f"{skipped[0]} rows or more" if skipped else "no probed row count"
    log.info("clustered int8: %s; the map is skipped at %s", found.describe(), where)
    return found


def probe(
    d: int,
    key: str,
    map_step: Callable[[torch.Tensor], object],
    full_step: Callable[[torch.Tensor], object],
    sample: Callable[[int], torch.Tensor],
) -> MapStepProbe:
    """The probe of the map ``key`` names at width ``d`` (with the machine's key added), from the cache,
    else measured and kept. ``map_step(h)`` / ``full_step(h)``: one step each way; ``sample(rows)``: rows
    as decoding meets them."""
    key = f"{gemm_probe.machine_key(d)}-{key}"
    path = switches.cache_root() / "probes" / "map-steps.json"
    known = gemm_probe.read_kept(path)
    if key in known:
        try:
            entry = known[key]
            return MapStepProbe(
                tuple(entry["rows"]), tuple(entry["map_us"]), tuple(entry["full_us"]), entry["measured"], True
            )
        except (KeyError, TypeError, ValueError):
            pass  # an older or damaged entry: measured again
    result = measure(map_step, full_step, sample)
    known[key] = {k: v for k, v in asdict(result).items() if k != "cached"}
    gemm_probe.keep(path, known)
    return result


def measure(
    map_step: Callable[[torch.Tensor], object],
    full_step: Callable[[torch.Tensor], object],
    sample: Callable[[int], torch.Tensor],
    rows: tuple[int, ...] = PROBE_ROWS,
    rounds: int = ROUNDS,
) -> MapStepProbe:
    """Both steps at each of ``rows`` on one thread (the decoding workers'), interleaved rounds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    map_us, full_us = [], []
    try:
        for n in rows:
            h = sample(n)
            steps = {"map": map_step, "full": full_step}
            for step in steps.values():  # warm-up: first calls allocate
                step(h)
            times: dict[str, list[float]] = {name: [] for name in steps}
            for r in range(rounds):
                for name in steps if r % 2 == 0 else reversed(steps):  # neither always goes first
                    t0 = time.perf_counter()
                    for _ in range(CALLS):
                        steps[name](h)
                    times[name].append((time.perf_counter() - t0) / CALLS * 1e6)
            map_us.append(round(statistics.median(times["map"]), 1))
            full_us.append(round(statistics.median(times["full"]), 1))
    finally:
        torch.set_num_threads(threads)
    now = dt.datetime.now().isoformat(timespec="seconds")
    return MapStepProbe(tuple(rows), tuple(map_us), tuple(full_us), now)

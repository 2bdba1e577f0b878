"""Which int8 GEMM runs a projection's one-thread steps of many rows on this machine, chosen by measuring.

fbgemm (torch's dynamic int8 linear) and MLAS (ONNX Runtime's ``MatMulIntegerToFloat``) sum the same
integers (``kernels.int8``), so either gives the same logits; which is faster depends on the CPU. On a Xeon
with AMX tiles MLAS took 0.67-0.78x fbgemm's time at d 1024, and 0.93-1.19x at d 256; on CPUs without AMX it
was not known. A rule by CPU flags guesses for the CPUs it was written on; this measures, once per machine
and width: :func:`probe` times both kernels on one thread at ``PROBE_ROWS`` rows over ``BLOCKS`` blocks of
``PROBE_COLUMNS`` columns of width d, streamed one after another as a union step streams them, in
interleaved rounds, and keeps the answer under ``probes/`` in the cache folder (``switches.cache_root``),
keyed by the CPU, its granted AMX state, the ISA caps in the environment and the two libraries' versions. A
later process reads it (well under a millisecond); a machine with other CPUs or libraries measures again. A
probe whose rounds disagree (a busy machine) is used for this process and not kept.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fastvocab import switches
from fastvocab.kernels.cpu_features import amx_usable, cpu_name

log = logging.getLogger(__name__)

PROBE_ROWS = 32  # a greedy batch of 32, a beam-4 batch of 8: what the many-row path serves
PROBE_COLUMNS = 4096  # a popular block's width (switches.INT8_BLOCK_COLUMNS' default)
# blocks streamed one after another, as a union step's popular blocks are: 32K columns, more than a core's
# caches hold at d 256 (a block run again and again from cache flattered MLAS: 1.28x there, 0.9x streamed)
BLOCKS = 8
ROUNDS = 7
CALLS = 2  # passes over the blocks per kernel and round, timed together
# MLAS must be this much faster on the probe to be chosen. Its block GEMM is not the whole of a step: on the
# 2-core Xeon with AMX at d 256, where the probe found MLAS 1.09-1.28x as fast, the demo model's clustered
# int8 greedy step at batch 32 ran 9% slower on it end to end (its union's choices and its calls' input
# quantisation around the GEMMs), though full int8 ran 22% faster; at d 1024 the probe finds 1.34-1.59x.
MARGIN = 1.25
# rounds whose ratios spread wider than this (max / min) come from a busy machine: not kept
STEADY_SPREAD = 1.5
# the environment that caps which kernels the libraries dispatch: a probe under other caps is another
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "MKL_DEBUG_CPU_TYPE")


MakeKernels = Callable[[int, int, int, int], dict[str, Callable[[], object]]]


@dataclass(frozen=True)
class GemmProbe:
    """One width's answer: the kernels' times per call (microseconds, median of the rounds), the choice,
    and whether it came from the cache."""

    d: int
    fbgemm_us: float
    onnxruntime_us: float
    choice: str  # "onnxruntime" | "fbgemm"
    steady: bool
    cpu: str
    measured: str  # when, ISO date-time
    cached: bool = False

    def describe(self) -> str:
        where = "cached" if self.cached else "measured now"
        ratio = self.fbgemm_us / self.onnxruntime_us if self.onnxruntime_us else float("nan")
        return (
            f"{self.choice} at d {self.d} ({where}, {self.measured}: {PROBE_ROWS} rows x {PROBE_COLUMNS} "
            f"columns on one thread, fbgemm {self.fbgemm_us:.0f} us, onnxruntime "
            f"{self.onnxruntime_us:.0f} us a call: fbgemm takes {ratio:.2f}x; onnxruntime needs {MARGIN:g}x)"
        )


def machine_key(d: int) -> str:
    """What the answer depends on: the CPU and its flags, whether AMX tiles are granted, the ISA caps set in
    the environment, the libraries' versions, the width."""
    try:
        import onnxruntime

        ort = onnxruntime.__version__
    except ImportError:  # a map probe's key without it (the GEMM probe needs it)
        ort = "none"
    caps = {name: os.environ.get(name, "") for name in ISA_ENV}
    parts = [cpu_name(), f"amx={amx_usable()}", json.dumps(caps, sort_keys=True)]
    parts += [f"torch={torch.__version__}", f"onnxruntime={ort}", f"d={d}"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def probe_file() -> Path:
    return switches.cache_root() / "probes" / "int8-gemm.json"


def probe(d: int, make_kernels: MakeKernels) -> GemmProbe:
    """The int8 GEMM for steps of many rows at width ``d``: from the cache, else measured (and kept if its
    rounds agree). ``make_kernels(d, rows, columns, blocks)``: the two kernels to time, each a call that runs
    ``rows`` random rows through ``blocks`` random blocks of ``columns`` int8 rows (``kernels.int8``'s, which
    imports this module)."""
    key = machine_key(d)
    path = probe_file()
    known = read_kept(path)
    if key in known:
        with contextlib.suppress(TypeError, ValueError):
            return GemmProbe(**{**known[key], "cached": True})
    result = measure(d, make_kernels)
    if result.steady:
        known[key] = {k: v for k, v in asdict(result).items() if k != "cached"}
        keep(path, known)
    log.info("int8 GEMM of one-thread steps of many rows: %s", result.describe())
    return result


def measure(d: int, make_kernels: MakeKernels, rounds: int = ROUNDS, calls: int = CALLS) -> GemmProbe:
    """Time the ``fbgemm`` and ``onnxruntime`` kernels ``make_kernels`` makes at width ``d``, one thread,
    interleaved rounds."""
    kernels = make_kernels(d, PROBE_ROWS, PROBE_COLUMNS, BLOCKS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the path serves one-thread workers
    try:
        for run in kernels.values():  # warm-up: first calls allocate and pack
            run()
            run()
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for r in range(rounds):
            order = list(kernels) if r % 2 == 0 else list(reversed(kernels))  # neither always goes first
            for name in order:
                t0 = time.perf_counter()
                for _ in range(calls):
                    kernels[name]()
                times[name].append((time.perf_counter() - t0) / (calls * BLOCKS) * 1e6)
    finally:
        torch.set_num_threads(threads)
    ratios = [f / o for f, o in zip(times["fbgemm"], times["onnxruntime"], strict=True)]
    fb, ort = statistics.median(times["fbgemm"]), statistics.median(times["onnxruntime"])
    return GemmProbe(
        d=d,
        fbgemm_us=round(fb, 1),
        onnxruntime_us=round(ort, 1),
        choice="onnxruntime" if fb > MARGIN * ort else "fbgemm",
        steady=max(ratios) / min(ratios) <= STEADY_SPREAD,
        cpu=cpu_name(),
        measured=dt.datetime.now().isoformat(timespec="seconds"),
    )


def read_kept(path: Path) -> dict:
    """The answers kept in a probe file, by key (none when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def keep(path: Path, known: dict) -> None:
    """Best effort: a cache folder that cannot be written means the next process measures again."""
    from fastvocab.artifacts_schema.atomic import write_text_atomic

    try:
        write_text_atomic(path, json.dumps(known, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        log.debug("cannot keep a probe in %s: %s", path, exc)

"""Every switch of fastvocab in one module: named, typed, defaulted and documented here, read through it.

Two kinds:

- **environment variables** (``FASTVOCAB_*``), what a user sets: each is read when its user asks for it
  (:meth:`Switch.get`), so a variable set after import counts wherever its user reads it per call; where a
  user keeps the first answer (the int8 GEMM's choice, the int8 cost table), its doc says when;
- **tuning switches**, constants the code was tuned to (how often the search reads back to the host, how
  many rows a call takes, how large a gathered block is): no variable sets them; tests and benchmarks change
  them with :func:`override`, never by patching a module's globals. A tuned constant is a switch here when
  something outside its module changes it; the others stay beside the code they tune, with the measurements
  that chose them.

:func:`override` sets switches for a block, in this process (and in the processes it forks, which inherit
it): it takes precedence over the environment, and restores what was there when the block ends. Values are
checked as the environment's are, with the same one-line errors.

Where this module lives: beside the package's ``__init__``, below every room (docs/ARCHITECTURE.md): its users
are in ``kernels``, ``decoding`` and ``tasks``, so it must sit under all three, and it imports nothing of
fastvocab (the layers contract in pyproject.toml lists it last). ``artifacts_schema``, the lowest room, holds
the on-disk formats, which a switch is not. The variables of other tools (``RAY_ADDRESS``,
``MLFLOW_TRACKING_URI``, ``NUMBA_CACHE_DIR``, ``XDG_CACHE_HOME``, ``OPENBLAS_CORETYPE``) are read where that
tool is used, not here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
PREFIX = "FASTVOCAB_"

# Every switch by name (each adds itself), and what override() holds now.
DECLARED: dict[str, Switch] = {}
_overrides: dict[str, object] = {}


@dataclass(frozen=True)
class Switch(Generic[T]):
    """One switch: ``name`` (as :func:`override` takes it), ``default``, ``doc`` and, for an environment
    variable, ``env``, its name. ``check(value, where)`` turns a value (the variable's text, or what
    :func:`override` was given) into the switch's type, or raises a ValueError naming ``where``."""

    name: str
    default: T
    doc: str
    check: Callable[[object, str], T]
    env: str | None = None

    def __post_init__(self) -> None:
        if self.name in DECLARED:
            raise ValueError(f"switch {self.name!r} is declared twice")
        if self.env is not None and not self.env.startswith(PREFIX):
            raise ValueError(f"switch {self.name!r}: its variable {self.env!r} must start with {PREFIX}")
        DECLARED[self.name] = self

    @property
    def label(self) -> str:
        """How errors name the switch: its variable, else its name."""
        return self.env or self.name

    def get(self) -> T:
        """The value now: an :func:`override`'s, else the variable's (unset or empty: not set), else the
        default."""
        if self.name in _overrides:
            return _overrides[self.name]  # type: ignore[return-value]  # checked by override()
        if self.env is not None:
            raw = os.environ.get(self.env)
            if raw:
                return self.check(raw, f"{self.env}={raw!r}")
        return self.default


def environment_variables() -> dict[str, Switch]:
    """The switches a variable sets, by the variable's name."""
    return {s.env: s for s in DECLARED.values() if s.env is not None}


@contextmanager
def override(**values: object) -> Iterator[None]:
    """Set the switches named by keyword (``override(CPU_SYNC_EVERY=3)``) until the block ends; each value
    checked as its variable's would be, an unknown name refused. Nested blocks restore in turn."""
    checked: dict[str, object] = {}
    for name, value in values.items():
        switch = DECLARED.get(name)
        if switch is None:
            raise ValueError(f"no switch {name!r}; the switches: {', '.join(sorted(DECLARED))}")
        if value is None and switch.default is not None:
            raise ValueError(f"{switch.label}=None: it has no unset state (default {switch.default!r})")
        checked[name] = value if value is None else switch.check(value, f"{switch.label}={value!r}")
    missing = object()
    before = {name: _overrides.get(name, missing) for name in checked}
    _overrides.update(checked)
    try:
        yield
    finally:
        for name, old in before.items():
            if old is missing:
                _overrides.pop(name, None)
            else:
                _overrides[name] = old


# ---------------------------------------------------------------------------------------------- checks


def _text(value: object, where: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a path, got {type(value).__name__}")
    return value


def _choice(*choices: str) -> Callable[[object, str], str]:
    def check(value: object, where: str) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"{where}: expected {', '.join(choices[:-1])} or {choices[-1]}")
        return text

    return check


def _number(least: float, most: float | None = None) -> Callable[[object, str], float]:
    def check(value: object, where: str) -> float:
        number = math.nan
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            with suppress(ValueError):
                number = float(value)
        if not (number >= least and (most is None or number <= most)):  # NaN fails both
            bound = f">= {least}" if most is None else f"from {least} to {most}"
            raise ValueError(f"{where}: expected a number {bound}")
        return number

    return check


def _count(least: int) -> Callable[[object, str], int]:
    def check(value: object, where: str) -> int:
        # a bool is an int to Python, never a count to a user
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{where}: expected an integer >= {least}")
        return value

    return check


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected True or False")
    return value


# ------------------------------------------------------------------------------- environment variables

CACHE_DIR: Switch[str | None] = Switch(
    "CACHE_DIR",
    None,
    "fastvocab's cache folder: remembered model fingerprints, the onnx engine's exports in engines/, the "
    "int8 GEMM probe's results in probes/; unset: $XDG_CACHE_HOME/fastvocab, else ~/.cache/fastvocab "
    "(cache_root). Read at each call.",
    _text,
    env="FASTVOCAB_CACHE_DIR",
)


def cache_root() -> Path:
    """fastvocab's cache folder: ``$FASTVOCAB_CACHE_DIR`` (:data:`CACHE_DIR`), else
    ``$XDG_CACHE_HOME/fastvocab``, else ``~/.cache/fastvocab``."""
    root = CACHE_DIR.get()
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastvocab"


CACHE_LIMIT_MB: Switch[float | None] = Switch(
    "CACHE_LIMIT_MB",
    None,
    "Cap on one allocation of the static decoder's cache, in MiB, where the decoder is given no "
    "max_cache_bytes (decoding.cache_memory.cache_limit); unset: only the device's free memory limits it. "
    "Read each time a static decoder is made.",
    _number(0.0),
    env="FASTVOCAB_CACHE_LIMIT_MB",
)
INT8_GEMM: Switch[str] = Switch(
    "INT8_GEMM",
    "auto",
    "Which int8 GEMM runs one-thread steps of many rows (kernels.int8.ort_at): fbgemm, onnxruntime (from "
    "ORT_MIN_DIM wide), or auto, the faster of the two at each width by the machine's probe "
    "(kernels.gemm_probe, kept in probes/ of the cache folder) where ONNX Runtime is installed. Read once "
    "per process, at the first int8 rows packed for many rows (ort_int8 keeps the answer).",
    _choice("auto", "fbgemm", "onnxruntime"),
    env="FASTVOCAB_INT8_GEMM",
)
INT8_GATHER: Switch[str] = Switch(
    "INT8_GATHER",
    "auto",
    "How the int8 union's gather multiplies its rows (kernels.int8_union.gather_multiply): int_mm "
    "(torch._int_mm), compiled (a numba loop over the rows in place), float32 (the same integers summed in "
    "float32; exact up to d 1040), or auto, the fastest at each width and row regime, timed once per process "
    "(torch._int_mm is a plain loop on CPUs without VNNI). Read once per process, width and regime.",
    _choice("auto", "int_mm", "compiled", "float32"),
    env="FASTVOCAB_INT8_GATHER",
)
INT8_COSTS: Switch[str | None] = Switch(
    "INT8_COSTS",
    None,
    "A cost table of the int8 union kernels (JSON, as union_costs.CostTable.to_json writes it) used instead "
    "of the packaged ones. Read by union_costs.load_cost_table when it is given no path: once for the "
    "projections, when kernels.int8_union is first imported (its COST_TABLE).",
    _text,
    env="FASTVOCAB_INT8_COSTS",
)

MAP_PROBE: Switch[str] = Switch(
    "MAP_PROBE",
    "auto",
    "Whether a clustered int8 projection in union mode times its map step against the full int8 step at "
    "16-128 rows when it is built (kernels.map_probe, kept in probes/ of the cache folder), so that steps "
    "of many rows skip the map where it measured slower: auto (measure, or read the kept answer) or off "
    "(the cost tables alone decide). Read when a projection is built.",
    _choice("auto", "off"),
    env="FASTVOCAB_MAP_PROBE",
)

# ----------------------------------------------------------------------------------- tuning switches

# decoding.search: when the host reads, and which rows leave the batch
COMPACT_FRACTION: Switch[float | None] = Switch(
    "COMPACT_FRACTION",
    None,
    "Greedy search: finished rows leave the batch once they are at least this share of it (0: every step); "
    "None: by device. On CPU every step: a compaction (index_select of the filled cache) costs less than "
    "carrying a finished row for one step (measured: benchmarks/history/engine-notes.md). On an accelerator "
    "in buckets (0.25): fewer shape changes and host syncs. Read at each search.",
    _number(0.0, 1.0),
)
SYNC_EVERY: Switch[int] = Switch(
    "SYNC_EVERY",
    4,
    "How often (in steps) the search reads its stop decision back to the host on an accelerator: a read "
    "waits for the device; rows and sentences that finish in between stay in the batch, their results "
    "frozen. Every step whenever a step_hook is given (records hold live rows only). Read at each search.",
    _count(1),
)
CPU_SYNC_EVERY: Switch[int] = Switch(
    "CPU_SYNC_EVERY",
    1,
    "SYNC_EVERY on CPU: 1, a read is free there; tests raise it to run the accelerator's schedule on CPU. "
    "Read at each search.",
    _count(1),
)
COMPILED_CANDIDATES: Switch[bool] = Switch(
    "COMPILED_CANDIDATES",
    True,
    "Beam search on CPU: each row's candidates are one compiled call (host_beam_step.row_candidates) at "
    "every width, from a beam-4 step of the shipped clustered maps (~2,500 scores) to the full layer at "
    "batch 32 (4M). False: torch's log-softmax and the blocked top-k, as on an accelerator (tests and "
    "benchmarks compare them). Read at each step.",
    _flag,
)

# tasks.dump: the reference path's projection calls
TEACHER_ROWS: Switch[int] = Switch(
    "TEACHER_ROWS",
    256,
    "Rows per projection call on the dump's reference path on CPU: 256 ran the demo model's 32K x 256 GEMM "
    "fastest on 2 cores (121 GFLOP/s against 85 at 1,024 rows); the least on CUDA. Read at each dump.",
    _count(1),
)
TEACHER_ROWS_CUDA: Switch[int] = Switch(
    "TEACHER_ROWS_CUDA",
    8192,
    "The most rows per projection call on the reference path on CUDA, which takes as many as keep a call's "
    "float32 logits within tasks.dump.TEACHER_LOGITS_BYTES (on an H200, batch 2,048, 1,024 to 8,192 rows "
    "ran the demo model's reference path 4-11% faster than 256 in the same run). Read at each dump.",
    _count(1),
)

# kernels.int8: which int8 GEMM a step of many rows runs
ORT_MIN_DIM: Switch[int] = Switch(
    "ORT_MIN_DIM",
    512,
    "With INT8_GEMM=onnxruntime, rows packed for many-row steps get an ONNX Runtime session (its int8 GEMM, "
    "MLAS, for steps of kernels.int8.ORT_MIN_ROWS rows or more) if they are this wide (d) or more: on the "
    "Xeon with AMX, MLAS won at d 1024, not at d 256 (kernels/int8.py, ORT_MIN_ROWS). With auto, the probe "
    "decides each width instead. Read when rows are packed.",
    _count(1),
)

# kernels.prepack: which float32 matrices are packed for oneDNN
PREPACK_MIN_BYTES: Switch[int] = Switch(
    "PREPACK_MIN_BYTES",
    4 << 20,
    "Float32 weights smaller than this stay plain, not pre-packed for oneDNN (the full projection's W, the "
    "decoder's linears: kernels.prepack): they sit in cache and oneDNN's per-call overhead wins (measured: "
    "benchmarks/history/engine-notes.md, 'Pre-packed decoder linears'). Read when a model or projection is "
    "made.",
    _count(0),
)

# kernels.int8_union and kernels.gather: blocks of a step's columns
INT8_BLOCK_COLUMNS: Switch[int] = Switch(
    "INT8_BLOCK_COLUMNS",
    4096,
    "Columns per packed int8 block of a union-mode clustered projection (int8_union.PopularBlocks): a union "
    "step's columns, ordered by how likely a row's set holds them, fall in blocks of this many; the popular "
    "ids' blocks are nearly full in every union of many rows and cost less run dense than gathered. Read "
    "when the blocks are packed.",
    _count(1),
)
INT8_GATHER_CHUNK_BYTES: Switch[int] = Switch(
    "INT8_GATHER_CHUNK_BYTES",
    4 << 20,
    "An int8 union step gathers its int8 rows a block at a time into a buffer of this size, so the int8 "
    "GEMM reads them from cache (256 KiB to 4 MiB tried: the same within noise; a 40% union at d 1024 "
    "gathered whole, 51 MiB, took 3x as long: a probe on the 2-core Xeon). Read at each step.",
    _count(1),
)
GATHER_CHUNK_BYTES: Switch[int] = Switch(
    "GATHER_CHUNK_BYTES",
    4 << 20,
    "CPU gathers of float rows of W (kernels.gather.gathered_logits) go through a reused block of this "
    "size: one big index_select would allocate a fresh C x d buffer per call (beyond glibc's mmap "
    "threshold, so every page faults in again: 3-5x slower at C = 12.5K, d = 1024, benchmarks/README.md) "
    "and stream it out of cache before the GEMM reads it back. Read at each step.",
    _count(1),
)

# tasks: rows a file is streamed in
READ_BATCH_ROWS: Switch[int] = Switch(
    "READ_BATCH_ROWS",
    65_536,
    "Rows the dump's driver (and a worker) decodes from a sources file at a time (tasks.row_shards). Read "
    "at each read.",
    _count(1),
)
CORPUS_BATCH_ROWS: Switch[int] = Switch(
    "CORPUS_BATCH_ROWS",
    100_000,
    "Rows per Parquet batch when a corpus file is streamed out (tasks.corpus, tasks.corpus_import): memory "
    "holds one batch of text at a time. Read at each file.",
    _count(1),
)

"""The measured costs that decide between the two kernels of a CPU int8 union step, recorded per machine.

An int8 union step, or one block of it in popularity order (``kernels.popular``), either gathers its
columns' int8 rows (a cost per gathered column) or runs the packed fbgemm GEMM over all its ids (a cost per
vocabulary column); which one is cheaper depends on the step's rows and on the machine (its vector units,
caches and memory), not on the model. The costs are measured, not modelled:
``benchmarks/bench_int8_gather.py --cost-table`` times both kernels at a few row counts and writes a table.
The package ships the table of the machine it was tuned on (``int8_costs.json``, which records that machine
and the result file it comes from), and one of a machine whose dense GEMM of many rows runs on ONNX Runtime
(``int8_costs_onnxruntime.json``, ``kernels.int8.ort_int8``), which a projection whose rows have sessions
reads; ``FASTVOCAB_INT8_COSTS`` (``switches.INT8_COSTS``) names another table, for a machine measured the
same way, read by both.
Both kernels give the same logits: a table changes only the time. Both packaged tables priced the gather
before it multiplied in int8, at 2-4x today's cost; they are kept, because a table of today's gather chose it
for the sparse blocks of steps of many rows, and a run on two workers took 1.8x as long as with the dense
GEMM (docs/cpu-engine.md, 0023).
"""

from __future__ import annotations

import functools
import json
import statistics
import timeit
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from fastvocab import switches

PACKAGED = "int8_costs.json"
# The table of a machine whose dense int8 GEMM of many rows runs on ONNX Runtime (``kernels.int8.ort_int8``):
# a projection whose rows have a session reads this one.
PACKAGED_ORT = "int8_costs_onnxruntime.json"


@dataclass(frozen=True)
class CostTable:
    """Per-column costs in microseconds at the step row counts ``rows`` (ascending, from 1): ``gather_us``
    per gathered column of the int8 gather, ``dense_us`` per vocabulary column of the packed int8 GEMM over
    all N. Between the rows measured the costs are interpolated; beyond the last both grow with the rows
    alike, so its ratio decides. ``measured_on``: the machine, the sizes and the source of the numbers."""

    rows: tuple[int, ...]
    gather_us: tuple[float, ...]
    dense_us: tuple[float, ...]
    measured_on: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.rows or list(self.rows) != sorted(set(self.rows)) or self.rows[0] != 1:
            raise ValueError(f"cost table rows must be ascending from 1, got {list(self.rows)}")
        if not len(self.gather_us) == len(self.dense_us) == len(self.rows):
            raise ValueError(
                f"cost table has {len(self.rows)} rows, {len(self.gather_us)} gather costs and "
                f"{len(self.dense_us)} dense costs"
            )
        if min(*self.gather_us, *self.dense_us) <= 0:
            raise ValueError("cost table costs must be > 0")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CostTable:
        return cls(
            rows=tuple(int(r) for r in data["rows"]),
            gather_us=tuple(float(c) for c in data["gather_us"]),
            dense_us=tuple(float(c) for c in data["dense_us"]),
            measured_on=dict(data.get("measured_on", {})),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "measured_on": dict(self.measured_on),
            "rows": list(self.rows),
            "gather_us": list(self.gather_us),
            "dense_us": list(self.dense_us),
        }


def load_cost_table(path: str | Path | None = None, packaged: str = PACKAGED) -> CostTable:
    """The table at ``path``; else the one ``FASTVOCAB_INT8_COSTS`` names (``switches.INT8_COSTS``); else the
    packaged one ``packaged``."""
    named = switches.INT8_COSTS.get() if path is None else None
    if named is not None:
        path, where = named, f"{switches.INT8_COSTS.env}={named}"
    else:
        where = str(path or packaged)
    try:
        if path is None:
            text = resources.files("fastvocab.kernels").joinpath(packaged).read_text()
        else:
            text = Path(path).read_text()
        return CostTable.from_json(json.loads(text))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not an int8 cost table ({exc})") from exc


def costs_from_timings(
    timings: Iterable[Mapping[str, Any]], n_vocab: int, measured_on: Mapping[str, Any]
) -> CostTable:
    """A table from timings of both kernels over the union ``union`` (a share of ``n_vocab``) at ``rows``
    rows (``{"kernel": "int8-gather" | "int8-dense", "rows", "union", "ms"}``, the rows
    :func:`time_kernels` and ``bench_int8_gather.py`` write): per row count, the median over the unions of
    each kernel's cost per column, the gather's per gathered column (``round(union * n_vocab)``), the dense
    GEMM's per vocabulary column. The median, not a fit: neither cost is linear in the unions measured."""
    gather, dense = "int8-gather", "int8-dense"
    per: dict[str, dict[int, list[float]]] = {gather: {}, dense: {}}
    for t in timings:
        if t["kernel"] in per:
            columns = round(t["union"] * n_vocab) if t["kernel"] == gather else n_vocab
            per[t["kernel"]].setdefault(int(t["rows"]), []).append(1e3 * t["ms"] / columns)
    rows = sorted(per[gather].keys() & per[dense].keys())
    return CostTable(
        rows=tuple(rows),
        gather_us=tuple(_digits(statistics.median(per[gather][r])) for r in rows),
        dense_us=tuple(_digits(statistics.median(per[dense][r])) for r in rows),
        measured_on=measured_on,
    )


# The sizes of the packaged tables' measurements: a few minutes on one thread.
COST_ROWS = (1, 2, 4, 6, 8, 12, 16, 24, 32)
COST_UNIONS = (0.05, 0.1, 0.2, 0.4)


def time_kernels(
    kernels: Mapping[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
    d: int,
    n_vocab: int,
    rows: Sequence[int] = COST_ROWS,
    unions: Sequence[float] = COST_UNIONS,
    repeats: int = 5,
) -> list[dict[str, Any]]:
    """Each kernel ``(h, cols) -> logits`` timed at each row count of ``rows`` over random unions of each
    share ``unions`` of ``n_vocab`` (sorted ids), on torch's current threads: the median of ``repeats`` calls
    after two warm-up calls, in ms (the rows :func:`costs_from_timings` reads)."""
    gen = torch.Generator().manual_seed(0)
    timings = []
    for r in rows:
        h = torch.randn(r, d, generator=gen)
        for u in unions:
            cols = torch.randperm(n_vocab, generator=gen)[: round(u * n_vocab)].sort().values
            for kernel, fn in kernels.items():
                run = functools.partial(fn, h, cols)
                run()
                run()
                ms = 1e3 * statistics.median(timeit.repeat(run, number=1, repeat=repeats))
                timings.append({"kernel": kernel, "rows": r, "union": u, "ms": ms})
    return timings


def machine(d: int, n_vocab: int, unions: Sequence[float], repeats: int) -> dict[str, Any]:
    """What a table's ``measured_on`` records of the measurement itself."""
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "d": d,
        "N": n_vocab,
        "unions": list(unions),
        "repeats": repeats,
    }


def _digits(us: float) -> float:
    # four significant digits: timings on a shared machine vary more than that from run to run
    return float(f"{us:.4g}")

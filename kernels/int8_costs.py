"""The measured costs that decide between the two int8 union kernels, recorded per machine.

An int8 union step either gathers its columns' int8 rows (a cost per gathered column) or runs the packed
fbgemm GEMM over all N columns (a cost per vocabulary column); which one is cheaper depends on the step's
rows and on the machine (its vector units, caches and memory), not on the model. The costs are measured, not
modelled: ``benchmarks/bench_int8_gather.py --cost-table`` times both kernels at a few row counts and
writes a table. The package ships the table of the machine it was tuned on (``int8_costs.json``, which
records that machine and the result file it comes from); ``FASTVOCAB_INT8_COSTS`` names another table, for
a machine measured the same way. Both kernels give the same logits: a table changes only the time.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

# Environment variable: a cost table (JSON, as ``CostTable.to_json`` writes it) to use instead of the
# packaged one, read once, when the int8 union kernels are first imported.
COSTS_ENV = "FASTVOCAB_INT8_COSTS"
PACKAGED = "int8_costs.json"


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


def load_cost_table(path: str | Path | None = None) -> CostTable:
    """The table at ``path``; else the one ``FASTVOCAB_INT8_COSTS`` names; else the packaged one."""
    if path is None and os.environ.get(COSTS_ENV):
        path, where = os.environ[COSTS_ENV], f"{COSTS_ENV}={os.environ[COSTS_ENV]}"
    else:
        where = str(path or PACKAGED)
    try:
        if path is None:
            text = resources.files("fastvocab.kernels").joinpath(PACKAGED).read_text()
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
    ``bench_int8_gather.py`` writes): per row count, the median over the unions of each kernel's cost per
    column, the gather's per gathered column (``round(union * n_vocab)``), the dense GEMM's per vocabulary
    column. The median, not a fit: neither cost is linear in the unions measured."""
    per: dict[str, dict[int, list[float]]] = {"int8-gather": {}, "int8-dense": {}}
    for t in timings:
        if t["kernel"] in per:
            columns = round(t["union"] * n_vocab) if t["kernel"] == "int8-gather" else n_vocab
            per[t["kernel"]].setdefault(int(t["rows"]), []).append(1e3 * t["ms"] / columns)
    rows = sorted(per["int8-gather"].keys() & per["int8-dense"].keys())
    return CostTable(
        rows=tuple(rows),
        gather_us=tuple(_digits(statistics.median(per["int8-gather"][r])) for r in rows),
        dense_us=tuple(_digits(statistics.median(per["int8-dense"][r])) for r in rows),
        measured_on=measured_on,
    )


def _digits(us: float) -> float:
    # four significant digits: timings on a shared machine vary more than that from run to run
    return float(f"{us:.4g}")

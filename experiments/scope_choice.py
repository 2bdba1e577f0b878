"""Which map serves a direction: its own (source and target known) or its target language's pooled map.

A direction with little text gets sparse sets from its own map; a map pooled over every source into the same
target (Amer et al.'s target-only scope) sees more states, at the price of larger sets. Which serves better
is measured, per direction, on text the maps never saw (the dev split): each candidate decodes the same
sentences with the same search, and the one with fewer search errors against full softmax wins; when the two
are within one sentence of each other, the one that computes fewer columns a row wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.cluster_map import MANIFEST_FILE, map_dir_name
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.decoding import Seq2SeqAdapter
from fastvocab.experiments.fidelity import FidelitySettings, run_fidelity


def candidates(maps_root: str | Path, direction: str) -> dict[str, Path]:
    """The maps under ``maps_root`` that can serve ``direction``: ``<src>-<tgt>`` and ``to-<tgt>``."""
    src, _, tgt = direction.partition("-")
    found = {}
    for scope in ("direction", "target"):
        name = map_dir_name(src, tgt, scope)
        if (Path(maps_root) / name / MANIFEST_FILE).is_file():
            found[name] = Path(maps_root) / name
    return found


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The measured rows of one candidate (every beam and batch asked for), averaged."""
    keys = ("search_errors", "identical", "active_columns_per_row", "speed_ratio")
    return {k: sum(float(r[k] or 0.0) for r in rows) / len(rows) for k in keys} | {
        "sentences": float(rows[0]["sentences"])
    }


def pick(measured: Mapping[str, Mapping[str, float]]) -> tuple[str, str]:
    """(the winning map, why): fewest search errors; within one sentence, fewest columns a row."""
    ranked = sorted(measured, key=lambda n: measured[n]["search_errors"])
    best = ranked[0]
    one_sentence = 1.0 / max(measured[best]["sentences"], 1.0)
    close = [
        n for n in ranked if measured[n]["search_errors"] - measured[best]["search_errors"] <= one_sentence
    ]
    best = min(close, key=lambda n: measured[n]["active_columns_per_row"])
    why = "; ".join(
        f"{n}: {100 * m['search_errors']:.1f}% search errors, {m['active_columns_per_row']:.0f} columns a row"
        for n, m in measured.items()
    )
    rule = "fewest search errors" if len(close) == 1 else "as few search errors, fewer columns"
    return best, f"{rule} on {measured[best]['sentences']:.0f} sentences ({why})"


def choose_maps(
    adapter: Seq2SeqAdapter,
    corpus: str | Path,
    maps_root: str | Path,
    directions: Sequence[str],
    settings: FidelitySettings,
    shortlists: Mapping[str, str | Path] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per direction: ``{"map": name, "why": ..., "measured": {candidate: summary}, "rows": [...]}``."""
    choices: dict[str, dict[str, Any]] = {}
    for direction in directions:
        found = candidates(maps_root, direction)
        if not found:
            raise ArtifactError(
                f"no map at {maps_root} can serve {direction} (its own, or its target's pooled)"
            )
        rows = {
            name: run_fidelity(adapter, corpus, path, [direction], settings, shortlists=shortlists)
            for name, path in found.items()
        }
        measured = {name: summarize(r) for name, r in rows.items()}
        best, why = pick(measured)
        choices[direction] = {
            "map": best,
            "why": why,
            "split": settings.split,
            "measured": measured,
            "rows": [row | {"candidate": name} for name, rs in rows.items() for row in rs],
        }
    return choices

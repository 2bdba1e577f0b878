"""What a user chose of the output-layer method's options, as one object.

``MethodSettings`` travels from the ``fastvocab translate`` flags and the pipeline's translate section to
``tasks.projections.method_options``, which turns it into the options of the method decoding; its fields
hold the one default of each choice, which the config's defaults and the CLI's help read. This module
imports nothing heavy, so the configuration loads without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MethodSettings:
    """The method options a user chose; None leaves the projection's own default (or its artifact's).

    ``selection``, ``inactive_mass`` (``auto``: by beam, ``tasks.projections.auto_inactive_mass``),
    ``exact`` and ``probes`` are clustered's; ``candidates`` is the indexed methods' k, ``bits`` lsh's,
    ``ef_search`` graph's, ``frequent`` and ``scope`` the shortlist's."""

    # clustered: rows share the union of their sets ("union"), or each reads its own ("per-row")
    selection: Literal["union", "per-row"] = "union"
    # clustered: estimate of the mass of the columns not computed (auto: none for greedy, the measured best
    # for beam search)
    inactive_mass: Literal["auto", "none", "centroid", "moments", "normaliser"] = "auto"
    exact: bool = False  # clustered: rows without an exactness certificate get the full projection
    probes: int | None = None  # clustered, union selection: nearest clusters a row reads (None: the map's)
    candidates: int | None = None  # lsh, graph, shortlist: candidates per row
    bits: int | None = None  # lsh without an index: hash bits
    ef_search: int | None = None  # graph: HNSW search queue
    frequent: int | None = None  # shortlist: most frequent target subwords always candidates
    scope: Literal["sentence", "batch"] | None = None  # shortlist: "sentence" or "batch"


DEFAULT_METHOD = MethodSettings()  # every field's default (frozen: one object serves all)

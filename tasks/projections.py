"""The output-layer method a translation decodes with, built over a loaded model's exact W and b, and the
options each method gets from what a user chose (the ``fastvocab translate`` flags, the pipeline's translate
section): one place, so the CLI and the pipeline decode a method alike."""

from __future__ import annotations

from pathlib import Path

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.kernels import create_projection
from fastvocab.kernels.base import Projection
from fastvocab.tasks.method_settings import DEFAULT_METHOD, MethodSettings
from fastvocab.tasks.methods import INDEXED_METHODS

# What ``inactive_mass="auto"`` stands for in beam search: the estimator with the fewest search errors
# measured. With the maps shipped beside the demo model, beam 4, batch 8, the whole test split: 3.8% / 2.9%
# search errors (en-it / it-en) against 4.3% / 4.1% without an estimate, at 0.82-0.85x of that one's speed
# (benchmarks/results/fidelity-cpu-2026-11-27-shipped-beam4-*.json). Greedy search reads logits only.
BEAM_INACTIVE_MASS = "normaliser"
# The same with a shortlist: the batch's candidates are columns outside the row's own set, whose exact mass
# the normaliser (an expansion of the mass outside that set) must take off its estimate, and where they hold
# most of it what is left is lost in the estimate's error. ``moments`` reads the mean and variance of the
# columns actually left out. With the shipped maps and tables, beam 4, batch 8, the whole test split: 5.3% /
# 6.4% (en-it / it-en) of outputs changed, against 8.8% / 10.9% with the normaliser and 0.9% (en-it) with
# the exact mass (benchmarks/results/methods-cpu-2026-11-27-hybrid-mass-b4.json).
SHORTLIST_BEAM_INACTIVE_MASS = "moments"
# The methods with an ``int8`` option (int8 output layer, CPU): a model loaded in int8 hands it to them; the
# others (lsh, graph, shortlist) compute their few columns in float32 beside the int8 decoder.
INT8_METHODS = ("full", "clustered")


def make_projection(adapter: Seq2SeqAdapter, method: str = "full", **options: object) -> Projection:
    """Output-layer method ``method`` over the adapter's exact W and b; EOS and language tags always on."""
    return create_projection(
        method,
        adapter.output_weight,
        adapter.output_bias,
        always_active=adapter.always_active_ids(),
        fingerprint=adapter.fingerprint,
        **options,
    )


def auto_inactive_mass(beam: int, shortlist: bool = False) -> str:
    """The inactive-mass estimator ``auto`` stands for at this beam size, with or without a shortlist."""
    if beam == 1:
        return "none"
    return SHORTLIST_BEAM_INACTIVE_MASS if shortlist else BEAM_INACTIVE_MASS


def exact_k_for(beam: int) -> int:
    """``exact_k`` that makes a search exact: greedy needs the top-1 certified, beam search the 2 x beam
    candidates it keeps per row."""
    return 1 if beam == 1 else 2 * beam


def clustered_options(
    selection: str,
    inactive_mass: str,
    exact: bool,
    beam: int,
    probes: int | None = None,
    shortlist: bool = False,
) -> dict[str, object]:
    """The clustered projection's options, its map and shortlist aside (``inactive_mass`` may be ``auto``;
    ``probes`` None: the map's own; ``shortlist``: whether one joins the sets)."""
    mass = auto_inactive_mass(beam, shortlist) if inactive_mass == "auto" else inactive_mass
    options: dict[str, object] = {"selection": selection, "inactive_mass": mass}
    if exact:
        options["exact_k"] = exact_k_for(beam)
    if probes is not None:
        options["probes"] = probes
    return options


def method_options(
    method: str,
    direction: str,
    settings: MethodSettings = DEFAULT_METHOD,
    *,
    beam: int,
    artifact: str | Path | None = None,
    shortlist: str | Path | None = None,
) -> dict[str, object]:
    """``make_projection``'s options for ``method`` decoding ``direction`` at ``beam``, from the options a
    user chose (``settings``).

    ``artifact``: the clustered map's folder (required for clustered), or the folder of an indexed method's
    artifact (:data:`~fastvocab.tasks.methods.INDEXED_METHODS`; lsh and graph build theirs in memory without
    it), found and checked by the caller; it is passed on as given. ``settings.selection``,
    ``inactive_mass``, ``exact`` and ``probes`` are clustered's; ``candidates`` is the indexed methods' k,
    ``bits`` lsh's, ``ef_search`` graph's, ``frequent`` and ``scope`` the shortlist's; ``shortlist``
    (clustered) a shortlist table folder whose candidates join the clusters' sets. None leaves the
    projection's own default (or the artifact's). Any other method gets no options.
    """
    s = settings
    if method == "clustered":
        if artifact is None:
            raise ValueError("the clustered method needs a cluster map")
        clustered: dict[str, object] = {"cluster_map": artifact}
        clustered.update(
            clustered_options(s.selection, s.inactive_mass, s.exact, beam, s.probes, shortlist is not None)
        )
        if shortlist is not None:
            clustered["shortlist"] = shortlist
        return clustered
    if method not in INDEXED_METHODS:
        return {}
    options: dict[str, object] = {}
    if artifact is not None:
        options["index"] = artifact
    if s.candidates is not None:
        options["k"] = s.candidates
    if method == "lsh" and s.bits is not None:
        options["bits"] = s.bits
    if method == "graph" and s.ef_search is not None:
        options["ef_search"] = s.ef_search
    if method == "shortlist":
        options["direction"] = direction  # the table is per direction: a foreign one is refused at load
        if s.frequent is not None:
            options["frequent"] = s.frequent
        if s.scope is not None:
            options["scope"] = s.scope
    return options

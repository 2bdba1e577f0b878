"""The clustered projection's options, grouped by the part of the projection each configures: which columns
a row gets (:class:`Selection`), how they are computed (:class:`Compute`), the estimate of the mass of the
columns left out (:class:`MassEstimate`) and the exactness certificate (:class:`Certificate`).

Each part checks its own values and their combinations when it is made, with a ValueError that names the
option; :class:`ClusteredParts` holds the four and checks what spans two of them. The options keep the
flat names that the registry passes
(``create_projection("clustered", W, b, cluster_map=..., selection="per-row", exact_k=1)``):
:meth:`ClusteredParts.pop` takes them out of such keywords and makes the parts.

:class:`ClusteredOptions` is what a user chooses of them (``fastvocab translate``'s flags, the pipeline's
translate section, ``fastvocab.Translator``), with the choices made by the beam (``auto`` inactive mass,
``exact``) left open until the search is known; its rules are the parts' own, checked by making them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from fastvocab.kernels.options import ArtifactPath, Flag, MethodOptions, option, required

SELECTIONS = ("union", "per-row")  # which columns each row gets: the batch's union, or its own cluster's
INACTIVE_MASS = ("none", "centroid", "moments", "normaliser")
SelectionName = Literal["union", "per-row"]  # SELECTIONS
InactiveMassChoice = Literal["auto", "none", "centroid", "moments", "normaliser"]  # "auto" and INACTIVE_MASS
# Also accepted as inactive_mass, a diagnostic of the fidelity harness and not a method (no CLI choice): the
# exact log-mass of the columns not computed, from the full logits of every row. It separates search errors
# due to the sets from those due to the estimate of their mass (experiments/fidelity.py names it ORACLE_MASS);
# it costs more than the full projection.
ORACLE = "oracle"
BACKENDS = ("auto", "torch", "cupy")
_MASS_RADIUS_NEEDS = "mass_radius needs an inactive_mass estimate and no exact_k"


def _choice(name: str, value: str, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(valid)}; got {value!r}")


def _integer(name: str, value: object, least: int) -> None:
    # a bool is an int to Python, never a count to a user
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True)
class Selection:
    """Which columns each row gets.

    ``selection``: union (the batch's union of the rows' sets, Amer et al.) or per-row (each row its own
    cluster's set). ``probes`` (union selection, torch backend): each row adds the sets of its ``probes``
    nearest clusters to the union, not only its nearest's, as an inverted-file index probes several lists; a
    state near the border of its cluster then still gets the tokens the clusters beside it hold; 1 = Amer et
    al.'s method; None = the map's own ``probes``, which per-row selection reads as 1. ``min_count``: the
    (cluster, id) pairs predicted fewer times are dropped from the sets. ``shortlist`` (union selection):
    a lexical shortlist table of the same model and direction (a method index or its folder,
    ``kernels/shortlist.py``) whose candidates for the batch's source sentences join every step's union:
    the clusters' sets miss mostly the source-specific content words, which is what a shortlist holds;
    ``shortlist_k`` and ``shortlist_frequent`` use fewer of its entries than it holds (None: all);
    ``shortlist_copy``: the source subwords are candidates too (the shortlist's ``copy``).
    """

    selection: str = "union"
    probes: int | None = None
    min_count: int = 1
    shortlist: Any = None
    shortlist_k: int | None = None
    shortlist_frequent: int | None = None
    shortlist_copy: bool = True

    def __post_init__(self) -> None:
        _choice("selection", self.selection, SELECTIONS)
        _integer("min_count", self.min_count, 1)
        if self.probes is not None:
            _integer("probes", self.probes, 1)
            if self.probes > 1 and self.selection != "union":
                raise ValueError(
                    "probes > 1 needs union selection (per-row groups rows by their one cluster)"
                )
        if self.shortlist is None:
            if self.shortlist_k is not None or self.shortlist_frequent is not None or not self.shortlist_copy:
                raise ValueError("shortlist_k, shortlist_frequent and shortlist_copy need a shortlist")
        elif self.selection != "union":
            raise ValueError("a shortlist joins the union of a step: it needs union selection")
        for name in ("shortlist_k", "shortlist_frequent"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 0)


@dataclass(frozen=True)
class Compute:
    """How the selected columns are computed.

    ``backend``: auto, torch or cupy. ``cache_mb``: the cached per-cluster sub-matrices (None = 512 on CPU,
    0 on CUDA; with ``int8``, packed int8 blocks). ``int8`` (CPU, torch backend): the full int8 projection's
    logits on the active columns (``dtype:int8`` in the signature). ``full_when_cheaper`` (int8 union
    mode): at row counts where the map's expected union costs more than the full int8 GEMM, every column
    without assigning clusters, counted in ``counters["full"]``; with ``exact_k``, the same at the steps
    where the certificate is measured not to pay (``kernels/exact_gate.py``; the outputs are the same).
    """

    backend: str = "auto"
    cache_mb: float | None = None
    int8: bool = False
    full_when_cheaper: bool = True

    def __post_init__(self) -> None:
        if self.int8 and self.backend == "cupy":
            raise ValueError(
                "int8 clustered projection needs the torch backend: the CuPy kernels are fp16/bf16"
            )
        _choice("backend", self.backend, BACKENDS)
        if self.cache_mb is not None and self.cache_mb < 0:
            raise ValueError(f"cache_mb must be >= 0, got {self.cache_mb}")
        # frozen: the normalised values are set once, here
        object.__setattr__(self, "int8", bool(self.int8))
        object.__setattr__(self, "full_when_cheaper", bool(self.full_when_cheaper))


@dataclass(frozen=True)
class MassEstimate:
    """The estimate of the mass of the columns a row did not compute.

    ``inactive_mass``: none, centroid, moments or normaliser (the map's stored normaliser when it was built
    for the sets in use, that is without ``min_count`` pruning and with the same always-active ids;
    otherwise it is computed at load time, for the pruned sets), or the :data:`ORACLE`. ``mass_radius``
    (None = off; with an estimate and no ``exact_k``): rows with ``||h - C_c||`` above it get the exact mass
    of the columns they did not compute, from their full logits, counted in ``counters["far"]``.
    """

    inactive_mass: str = "none"
    mass_radius: float | None = None

    def __post_init__(self) -> None:
        _choice("inactive_mass", self.inactive_mass, (*INACTIVE_MASS, ORACLE))
        if self.mass_radius is not None:
            if not self.mass_radius > 0:
                raise ValueError(f"mass_radius must be > 0 (or None), got {self.mass_radius!r}")
            if self.inactive_mass == "none":
                raise ValueError(_MASS_RADIUS_NEEDS)
            object.__setattr__(self, "mass_radius", float(self.mass_radius))


@dataclass(frozen=True)
class Certificate:
    """The exactness certificate.

    ``exact_k``: 0 = off; 1 for greedy search, ``2 * beam`` for beam search: rows without an exactness
    certificate for their top-``exact_k`` get full logits. ``exact_tol`` (for ``exact_k > 1``): the largest
    change of a certified row's log-normaliser allowed, in nats. ``bound_blocks``: the column blocks of the
    certificate's bound.
    """

    exact_k: int = 0
    exact_tol: float = 1e-5
    bound_blocks: int = 64

    def __post_init__(self) -> None:
        _integer("exact_k", self.exact_k, 0)
        _integer("bound_blocks", self.bound_blocks, 0)
        if not self.exact_tol >= 0:
            raise ValueError(f"exact_tol must be >= 0, got {self.exact_tol!r}")
        object.__setattr__(self, "exact_tol", float(self.exact_tol))


@dataclass(frozen=True)
class ClusteredParts:
    """The four parts of a clustered projection's options."""

    selection: Selection = field(default_factory=Selection)
    compute: Compute = field(default_factory=Compute)
    mass: MassEstimate = field(default_factory=MassEstimate)
    certificate: Certificate = field(default_factory=Certificate)

    def __post_init__(self) -> None:
        # a certificate already sends the rows it cannot vouch for to their full logits
        if self.mass.mass_radius is not None and self.certificate.exact_k:
            raise ValueError(_MASS_RADIUS_NEEDS)
        if self.selection.shortlist is not None and self.compute.backend == "cupy":
            raise ValueError(
                "a shortlist needs the torch backend: the CuPy kernels read only the clusters' sets"
            )

    @classmethod
    def pop(cls, options: dict[str, Any]) -> ClusteredParts:
        """The parts from flat keyword options, as ``create_projection`` passes them, taken out of
        ``options``: what is left there is no clustered option."""

        def part(kind: type[Any]) -> Any:
            return kind(**{f.name: options.pop(f.name) for f in fields(kind) if f.name in options})

        return cls(part(Selection), part(Compute), part(MassEstimate), part(Certificate))


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
AUTO = "auto"  # the inactive mass chosen by the beam (auto_inactive_mass)


def auto_inactive_mass(beam: int, shortlist: bool = False) -> str:
    """The inactive-mass estimator ``auto`` stands for at this beam size, with or without a shortlist."""
    if beam == 1:
        return "none"
    return SHORTLIST_BEAM_INACTIVE_MASS if shortlist else BEAM_INACTIVE_MASS


def exact_k_for(beam: int) -> int:
    """``exact_k`` that makes a search exact: greedy needs the top-1 certified, beam search the 2 x beam
    candidates it keeps per row."""
    return 1 if beam == 1 else 2 * beam


def clustered_kwargs(
    selection: str,
    inactive_mass: str,
    exact: bool,
    beam: int,
    probes: int | None = None,
    shortlist: bool = False,
) -> dict[str, object]:
    """The clustered projection's keyword options for a search at ``beam``, its map and shortlist aside
    (``inactive_mass`` may be ``auto``; ``probes`` None: the map's own; ``shortlist``: whether one joins)."""
    mass = auto_inactive_mass(beam, shortlist) if inactive_mass == AUTO else inactive_mass
    kwargs: dict[str, object] = {"selection": selection, "inactive_mass": mass}
    if exact:
        kwargs["exact_k"] = exact_k_for(beam)
    if probes is not None:
        kwargs["probes"] = probes
    return kwargs


@dataclass(frozen=True)
class ClusteredOptions(MethodOptions):
    """What a user chooses of the clustered method. ``cluster_map`` and ``shortlist`` are folders found
    and checked once, before the job (``pipeline/method_choice.py``): a map of the direction decoded, and
    a lexical shortlist table of the same model and direction whose candidates join every step's union."""

    method: ClassVar[str] = "clustered"

    cluster_map: ArtifactPath = required(
        Flag(
            "--clusters",
            "cluster map folder, or a folder of them; implies --method clustered",
            type=Path,
            metavar="DIR",
            needed="a cluster map folder, or a folder of them",
        )
    )
    selection: SelectionName = option(
        "union",
        Flag(
            "--selection",
            "every row of a batch gets the union of the batch's clusters' columns (union), or only its own "
            "cluster's (per-row)",
            choices=SELECTIONS,
        ),
    )
    probes: int | None = option(
        None,
        Flag(
            "--probes",
            "union selection: each row adds the sets of its N nearest clusters to the union, not only its "
            "nearest's (fewer misses for states between clusters, more columns)",
            type=int,
            metavar="N",
            default="the map's own, which its builder chose, maps.probes; 1 for maps that do not record one",
        ),
    )
    inactive_mass: InactiveMassChoice = option(
        AUTO,
        Flag(
            "--inactive-mass",
            "estimate of the probability mass of the columns not computed, so beam scores stay comparable "
            f"(auto: {BEAM_INACTIVE_MASS} for --beam > 1, the fewest search errors measured, from the "
            f"normaliser stored in the map, {SHORTLIST_BEAM_INACTIVE_MASS} with a shortlist; none for "
            "greedy, which reads logits only)",
            choices=(AUTO, *INACTIVE_MASS),
        ),
    )
    exact: bool = option(
        False,
        Flag(
            "--exact",
            "certify each decoder row (a bound on every column not computed) and give rows without a "
            "certificate the full projection: output identical to --method full; while the certificate "
            "vouches for fewer rows than it would need to pay, whole steps take the full projection "
            "(measured as it decodes); prints the certified share of rows",
            type=bool,
        ),
    )
    shortlist: ArtifactPath | None = option(
        None,
        Flag(
            "--with-shortlist",
            "union selection: a lexical shortlist of this model and direction (as --index finds it) whose "
            "candidates for the batch's sentences join every step's columns: the clusters' sets then need "
            "fewer ids for the same fidelity (maps with maps.k: 1)",
            type=Path,
            metavar="DIR",
            default="the tables beside the maps, DIR/shortlist/ of --clusters DIR or of the map's parent "
            "folder, where they exist",
        ),
    )

    def __post_init__(self) -> None:
        # the projection's own rules, checked by making its parts: one place for each
        Selection(self.selection, self.probes, shortlist=self.shortlist)
        _choice("inactive_mass", self.inactive_mass, (AUTO, *INACTIVE_MASS))
        object.__setattr__(self, "exact", bool(self.exact))

    def projection_kwargs(self, beam: int = 1, int8: bool = False) -> dict[str, object]:
        kwargs: dict[str, object] = {"cluster_map": self.cluster_map}
        shortlist = self.shortlist is not None
        kwargs.update(
            clustered_kwargs(self.selection, self.inactive_mass, self.exact, beam, self.probes, shortlist)
        )
        if shortlist:
            kwargs["shortlist"] = self.shortlist
        if int8:
            kwargs["int8"] = True
        return kwargs

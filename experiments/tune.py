"""Tuning a clustered map for one direction: the fastest settings within a search-error budget.

Behind ``fastvocab tune``. A *candidate* is (r, K, min_count, selection): r centroids (Faiss k-means,
``tasks/kmeans.py``), the top-K ids of every member state in its cluster's set, (cluster, id) pairs seen
fewer than ``min_count`` times pruned (``tasks/maps.py``; the pipeline's ``maps.min_count``), and the
selection at decode time (``union`` of the rows' sets, or ``per-row``). Every candidate map is built from
the stored states of a pipeline work dir (``<work_dir>/states``: one k-means per r, one assignment pass per r
for every K), never from the corpus' dev or test text.

Candidates are measured with the fidelity yardstick's pieces (``experiments/fidelity.py``: ``decode_all`` runs
full softmax and every candidate on each batch in turn, ``Scorer`` scores outputs under the full model,
``agreement`` gives the identical-output and search error rates) on the corpus' **dev** split, at the user's
beam and batch size, by successive halving over *rungs* of growing size (the first n_i dev sentences; the
rungs' sentence lists are prefixes of each other):

1. every candidate decodes the first rung's sentences;
2. a candidate whose erroneous sentences already outnumber what the last rung allows
   (``allowed_errors``: the most whose upper confidence bound stays within the budget) is dropped (errors
   on a prefix of the final sentences rarely vanish when more sentences are added; batches are formed
   anew, so this is a rule of thumb, not a proof); of the others the fastest ``ceil(n / eta)`` go on,
   plus the fastest one without any error and the fastest of each (K, min_count) (fallbacks: a short rung
   cannot tell a small set's rate from a larger one's);
3. the last rung decides: the fastest candidate (``rank_by``: wall-time or CPU-time ratio to full softmax
   measured in the same pass) whose search error rate is within the budget at ``confidence``: the
   one-sided Clopper-Pearson upper bound of its rate, not the rate itself. The fastest of many candidates
   is the one whose dev rate most likely runs low (4 errors in 100 passed a 5% budget, then made 7 in 100 on
   test); the bound leaves that margin. The last rung is grown to the sentences that a run without any
   error needs to meet the bound (``sentences_for_budget``: 45 at 5%, 230 at 1%, at 90%).

The choice is then checked on the **test** split (full softmax and the chosen map, same settings):
``within_budget_on_test`` says whether the budget held there. Plain functions: no Ray, no MLflow; the
command (``pipeline/commands/tune.py``) prints, saves the map and logs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from fastvocab.artifacts_schema.cluster_map import ClusterMap
from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.hidden_states import read_shard_meta, shard_rows
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.settings import SearchSettings
from fastvocab.experiments.fidelity import Reference, Scorer, decode_passes
from fastvocab.kernels.base import Projection
from fastvocab.kernels.clustered_parts import SELECTIONS, ClusteredOptions
from fastvocab.tasks.kmeans import KMeansParams, sample_states, train_kmeans
from fastvocab.tasks.maps import (
    ActiveSetCounter,
    MapParams,
    attach_normaliser,
    count_shards_by_k,
    make_cluster_map,
)
from fastvocab.tasks.projections import clustered_options, make_projection


@dataclass(frozen=True)
class TuneGrid:
    """The candidates tried: every combination of these values."""

    rs: tuple[int, ...]
    ks: tuple[int, ...]
    min_counts: tuple[int, ...]
    selections: tuple[str, ...]
    rungs: tuple[int, ...]  # dev sentences per rung of successive halving (the last decides)


GRIDS = {
    # 3 x 3 x 2 x 2 = 36 candidates; 30 then 100 dev sentences
    "quick": TuneGrid((100, 200, 500), (1, 3, 5), (1, 2), SELECTIONS, (30, 100)),
    # 5 x 3 x 3 x 2 = 90 candidates (r as the paper's Fig. 3); 60, 200, then 600 dev sentences
    "full": TuneGrid((100, 200, 500, 1000, 2000), (1, 3, 5), (1, 2, 3), SELECTIONS, (60, 200, 600)),
}
RANK_BY = {"wall": "speed_ratio", "cpu": "cpu_ratio"}


def beam_ks(beam: int) -> tuple[int, ...]:
    """The grid's K at beam ``beam`` > 1: beam search keeps ``2 x beam`` candidates per row, so the sets are
    tried with the top ``beam``, ``3 x beam / 2`` and ``2 x beam`` ids of each state (the greedy grid's 1, 3
    and 5 would leave most of them out)."""
    return tuple(sorted({beam, (3 * beam + 1) // 2, 2 * beam}))


class BudgetNotMet(ValueError):
    """No candidate stayed within the search-error budget on the dev split."""


@dataclass(frozen=True)
class Candidate:
    r: int
    k: int
    min_count: int
    selection: str
    probes: int = (
        1  # nearest clusters a row reads (a decoding setting: candidates differing in it share a map)
    )

    @property
    def label(self) -> str:
        probes = f" probes={self.probes}" if self.probes != 1 else ""
        return f"r={self.r} K={self.k} min_count={self.min_count}{probes} {self.selection}"

    @property
    def map_key(self) -> tuple[int, int, int]:
        return (self.r, self.k, self.min_count)

    def config_keys(
        self, beam: int, state_beams: Sequence[int] = (1,), normaliser_rank: int | None = None
    ) -> dict[str, Any]:
        """The pipeline config keys (configs/demo.yaml) that build and use this map, from states dumped along
        ``state_beams`` (and, with ``normaliser_rank``, its normaliser's)."""
        rank = {} if normaliser_rank is None else {"maps.normaliser_rank": normaliser_rank}
        return {
            "kmeans.r": self.r,
            "maps.k": self.k,
            "maps.min_count": self.min_count,
            "maps.probes": self.probes,
            "maps.beams": list(state_beams),
            **rank,
            "translate.selection": self.selection,
            "translate.beam": beam,
        }


@dataclass(frozen=True)
class TuneSettings:
    """What one tuning run searches and how it measures."""

    budget: float = 0.01  # largest search error rate allowed on the dev split (a share of sentences)
    confidence: float = 0.9  # the dev rate's upper bound at this level must meet the budget (0: the rate)
    beam: int = SearchSettings.beam
    batch_size: int = SearchSettings.batch_size
    grid: str = "quick"
    rs: tuple[int, ...] | None = None  # None: the grid's
    ks: tuple[int, ...] | None = None
    min_counts: tuple[int, ...] | None = None
    selections: tuple[str, ...] | None = None
    rungs: tuple[int, ...] | None = None
    eta: int = 3  # keep the fastest 1/eta of the candidates within reach of the budget at each rung
    rank_by: str = "wall"  # wall | cpu: the speed ratio the choice maximises
    test_sentences: int | None = None  # test sentences for the check (default: the last rung's count)
    max_len: int = SearchSettings.max_len
    length_penalty: float = SearchSettings.length_penalty
    # as translate.inactive_mass (auto: none greedy, normaliser beam search)
    inactive_mass: str = ClusteredOptions.inactive_mass
    repeats: int = 1  # timed passes per rung (median)
    probes: tuple[int, ...] = (1,)  # nearest clusters a row reads: an axis of the grid
    shortlist: str | None = None  # a shortlist table whose candidates join every candidate's sets (union)
    kmeans: KMeansParams = field(default_factory=KMeansParams)  # niter, seed, points; r comes from the grid
    normaliser_rank: int = MapParams().normaliser_rank  # the pipeline's maps.normaliser_rank default

    def __post_init__(self) -> None:
        if self.grid not in GRIDS:
            raise ValueError(f"unknown grid {self.grid!r}; valid: {', '.join(sorted(GRIDS))}")
        if not 0.0 <= self.budget < 1.0:
            raise ValueError(f"budget is a share of sentences in [0, 1), got {self.budget}")
        if not 0.0 <= self.confidence < 1.0:
            raise ValueError(f"confidence is a level in [0, 1), got {self.confidence}")
        if self.budget == 0.0 and self.confidence > 0.0:
            raise ValueError(
                "no number of error-free sentences bounds a rate at 0: a budget above 0, or confidence 0"
            )
        if self.rank_by not in RANK_BY:
            raise ValueError(f"rank_by must be one of {', '.join(RANK_BY)}, got {self.rank_by!r}")
        bad = [s for s in self.selections or () if s not in SELECTIONS]
        if bad:
            raise ValueError(f"unknown selections {bad}; valid: {', '.join(SELECTIONS)}")
        if self.shortlist is not None and "per-row" in (self.selections or ()):
            raise ValueError("a shortlist joins a batch's union: per-row selection does not take one")
        ints = [*(self.rs or ()), *(self.ks or ()), *(self.min_counts or ()), *(self.rungs or ())]
        ints += list(self.probes) or [0]
        if min([self.beam, self.batch_size, self.eta, self.repeats, self.max_len, *ints]) < 1:
            raise ValueError(
                f"beam, batch size, eta, repeats, r, K, min_count, probes and rungs must be >= 1: {self}"
            )
        if self.normaliser_rank < 0:
            raise ValueError(f"normaliser_rank must be >= 0, got {self.normaliser_rank}")
        if list(self.resolved_rungs) != sorted(set(self.resolved_rungs)):
            raise ValueError(f"rungs must grow, got {self.resolved_rungs}")

    def _pick(self, name: str) -> tuple:
        own = getattr(self, name)
        if own:
            return tuple(own)
        if name == "ks" and self.beam > 1:
            return beam_ks(self.beam)
        if name == "selections" and self.shortlist is not None:
            return ("union",)  # the shortlist joins a batch's union
        return getattr(GRIDS[self.grid], name)

    @property
    def resolved_rungs(self) -> tuple[int, ...]:
        """The grid's (or --rungs') rungs, the last grown to ``sentences_for_budget`` where it is short."""
        rungs = self._pick("rungs")
        need = sentences_for_budget(self.budget, self.confidence)
        return rungs if rungs[-1] >= need else (*rungs[:-1], need)

    def candidates(self, recorded_k: int) -> list[Candidate]:
        """Every combination of the grid (K above what the dump recorded left out)."""
        ks = [k for k in self._pick("ks") if k <= recorded_k]
        if not ks:
            raise ValueError(f"every K of {self._pick('ks')} exceeds the K={recorded_k} the dump recorded")
        return [
            Candidate(r, k, mc, sel, probes)
            for r in sorted(self._pick("rs"))
            for k in sorted(ks)
            for mc in sorted(self._pick("min_counts"))
            for probes in sorted(self.probes)
            for sel in self._pick("selections")
        ]

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            rs=list(self._pick("rs")),
            ks=list(self._pick("ks")),
            min_counts=list(self._pick("min_counts")),
            selections=list(self._pick("selections")),
            rungs=list(self.resolved_rungs),
        )
        return d


# ------------------------------------------------------------------------------------------------ the maps


def build_candidate_maps(
    adapter: Seq2SeqAdapter,
    files: Sequence[Path],
    direction: str,
    candidates: Sequence[Candidate],
    settings: TuneSettings,
    on_note: Callable[[str], None] | None = None,
) -> tuple[dict[tuple[int, int, int], ClusterMap], dict[int, dict[str, float]]]:
    """Every map the candidates need, keyed by (r, K, min_count), built from the stored states ``files``:
    one k-means per r (``tasks.kmeans``), one assignment pass per r for all K (``tasks.maps``). With beam
    search and the normaliser estimate the maps get their normaliser. Also per r: k-means seconds etc."""
    note = on_note or (lambda _msg: None)
    p = settings.kmeans
    threads = p.threads if p.threads is not None else torch.get_num_threads()
    needed = sorted({c.map_key for c in candidates})
    total = sum(shard_rows(list(files)))
    mass = clustered_options("union", settings.inactive_mass, False, settings.beam)["inactive_mass"]
    maps: dict[tuple[int, int, int], ClusterMap] = {}
    info: dict[int, dict[str, float]] = {}
    for r in sorted({key[0] for key in needed}):
        if total < r:
            raise ValueError(f"k-means with r={r} needs at least {r} stored states, {direction} has {total}")
        t0 = time.perf_counter()
        x, _ = sample_states(files, r * p.max_points_per_centroid, p.seed)
        centroids, km = train_kmeans(
            x,
            r,
            niter=p.niter,
            seed=p.seed,
            max_points_per_centroid=p.max_points_per_centroid,
            gpu=p.gpu,
            threads=threads,
        )
        del x
        ks = sorted({key[1] for key in needed if key[0] == r})
        counters = count_shards_by_k(files, centroids, {k: ActiveSetCounter(r, adapter.n_vocab) for k in ks})
        for _, k, mc in (key for key in needed if key[0] == r):
            cmap = make_cluster_map(
                centroids,
                counters[k],
                MapParams(scope="direction", k=k, min_count=mc),
                model_fingerprint=adapter.fingerprint,
                name=direction,
                niter=p.niter,
                seed=p.seed,
                extra={"directions": [direction], "stored_states": counters[k].states, "tuned": True},
            )
            if mass == "normaliser":
                attach_normaliser(
                    cmap,
                    adapter.output_weight,
                    adapter.output_bias,
                    adapter.always_active_ids(),
                    settings.normaliser_rank,
                )
            maps[(r, k, mc)] = cmap
        info[r] = {
            "kmeans_seconds": round(km.seconds, 2),
            "maps_seconds": round(time.perf_counter() - t0 - km.seconds, 2),
            "states": total,
            "kmeans_objective": km.objective[-1] if km.objective else float("nan"),
        }
        note(f"{direction}: r={r}: k-means {km.seconds:.1f} s on {km.n_train} states; maps for K={ks}")
    return maps, info


def finish_map(adapter: Seq2SeqAdapter, cmap: ClusterMap, normaliser_rank: int) -> ClusterMap:
    """The map as the pipeline's maps stage writes it: with its normaliser (any beam can use it)."""
    if cmap.normaliser is None:
        attach_normaliser(
            cmap, adapter.output_weight, adapter.output_bias, adapter.always_active_ids(), normaliser_rank
        )
    return cmap


# ------------------------------------------------------------------------------------------------ measuring


def projection_for(
    adapter: Seq2SeqAdapter, cand: Candidate, cmap: ClusterMap, settings: TuneSettings
) -> Projection:
    """The clustered projection ``fastvocab translate`` would use with this map and these settings (and
    ``--with-shortlist``'s table)."""
    shortlist = settings.shortlist is not None
    opts = clustered_options(
        cand.selection, settings.inactive_mass, False, settings.beam, cand.probes, shortlist
    )
    if shortlist:
        opts["shortlist"] = settings.shortlist
    return make_projection(adapter, "clustered", cluster_map=cmap, **opts)


# The deciding rung and the test check time each candidate against full softmax until the ratios of its
# passes (each pass interleaves the two batch by batch) lie within this share of their median, from
# STABLE_PASSES passes up to MAX_PASSES; a candidate still outside is flagged ``speed_stable: false``. On a
# shared 2-core machine one pass gave dev ratios from 0.39x to 10.86x, and a choice of 6.0x on dev ran
# 1.36x on test.
STABLE_SPREAD = 0.15
STABLE_PASSES, MAX_PASSES = 3, 6


def measure_candidates(
    adapter: Seq2SeqAdapter,
    full: Projection,
    projs: dict[Candidate, Projection],
    seqs: Sequence[list[int]],
    refs: Sequence[str],
    src: str,
    tgt: str,
    settings: TuneSettings,
    scorer: Scorer,
    stable: bool = False,
) -> list[dict[str, Any]]:
    """Full softmax and every candidate on the same sentences, batch by batch in turn (the yardstick's
    ``decode_all``); one row per candidate with the yardstick's agreement, BLEU/chrF and speed ratios.

    ``stable``: passes are repeated until each candidate's per-pass speed ratios agree
    (:data:`STABLE_SPREAD`), and its ``speed_ratio`` is their median (``speed_ratio_passes``,
    ``speed_stable``). Every row's ``started`` and ``ended`` (seconds since the epoch) are this call's:
    the candidates decode batch by batch in turn, so each one's work spans all of it."""
    started = time.time()
    everything: dict[str, Projection] = {"full": full, **{c.label: p for c, p in projs.items()}}
    args = (src, tgt, settings.beam, settings.batch_size, settings.max_len, settings.length_penalty)
    repeats = max(settings.repeats, STABLE_PASSES) if stable else settings.repeats
    passes = decode_passes(adapter, everything, seqs, args, repeats)
    ratios = {
        c.label: [f / t for f, t in zip(passes.wall["full"], passes.wall[c.label], strict=True)]
        for c in projs
    }
    if stable:
        for _ in range(repeats, MAX_PASSES):
            unsteady = [c for c in projs if not _steady(ratios[c.label])]
            if not unsteady:
                break
            again = decode_passes(
                adapter, {"full": full, **{c.label: projs[c] for c in unsteady}}, seqs, args, 1, warm_up=False
            )
            for c in unsteady:
                ratios[c.label].append(again.wall["full"][0] / again.wall[c.label][0])
    ref = Reference.of(passes, "full", scorer, adapter, refs)
    rows = []
    for cand, p in projs.items():
        n = len(passes.outputs[cand.label])
        cols = p.stats()["active_columns_per_row"]
        compared = ref.compare(passes, cand.label, scorer, adapter, refs)
        if stable:
            compared["speed_ratio"] = round(statistics.median(ratios[cand.label]), 3)
            compared["speed_ratio_passes"] = [round(r, 3) for r in ratios[cand.label]]
            compared["speed_stable"] = _steady(ratios[cand.label])
        rows.append(
            {
                "direction": f"{src}-{tgt}",
                "beam": settings.beam,
                "batch": settings.batch_size,
                "label": cand.label,
                **asdict(cand),
                "options": p.options(),
                "sentences": n,
                **compared,
                "search_error_sentences": round(compared["search_errors"] * n),
                "active_columns_per_row": None if cols is None else round(cols, 1),
            }
        )
    ended = time.time()
    for row in rows:
        row.update(started=started, ended=ended)
    return rows


def _steady(ratios: Sequence[float]) -> bool:
    mid = statistics.median(ratios)
    return len(ratios) >= 2 and max(abs(r - mid) for r in ratios) <= STABLE_SPREAD * mid


def _sentences(corpus: str | Path, src: str, tgt: str, split: str, n: int) -> tuple[list[str], list[str]]:
    _, sources, refs = read_direction(corpus, src, tgt, split, limit=n)
    keep = [i for i, s in enumerate(sources) if s.strip()]
    return [sources[i] for i in keep], [refs[i] for i in keep]


def error_bound(errors: int, n: int, confidence: float) -> float:
    """The one-sided Clopper-Pearson upper bound of a rate seen as ``errors`` in ``n`` at ``confidence``
    (the rate itself at 0): the largest true rate under which so few errors have a chance of at least
    1 - confidence."""
    if confidence == 0.0 or n == 0:
        return errors / n if n else 1.0
    if errors >= n:
        return 1.0
    from scipy.stats import beta  # the pipeline extra brings it (with MLflow); only tune needs it

    return float(beta.ppf(confidence, errors + 1, n - errors))


def row_bound(row: dict[str, Any], confidence: float) -> float:
    """:func:`error_bound` of a measured row's search errors."""
    return error_bound(int(row["search_error_sentences"]), int(row["sentences"]), confidence)


def allowed_errors(budget: float, n: int, confidence: float) -> int:
    """The most erroneous sentences in ``n`` whose rate's bound stays within ``budget`` (-1: not even 0)."""
    k = -1
    while k + 1 <= n and error_bound(k + 1, n, confidence) <= budget + 1e-12:
        k += 1
    return k


def sentences_for_budget(budget: float, confidence: float) -> int:
    """The fewest sentences whose error-free run bounds the rate within ``budget``:
    1 - (1 - c)^(1/n) <= budget."""
    if confidence == 0.0 or budget <= 0.0:
        return 1
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - budget) - 1e-9)


def survivors(
    rows: Sequence[dict[str, Any]], allowed: int, eta: int, rank_key: str
) -> tuple[list[str], list[str]]:
    """Successive halving's cut after a rung: (labels kept, labels dropped for errors). Kept: the fastest
    ``ceil(n / eta)`` of those with at most ``allowed`` erroneous sentences, plus the fastest error-free, plus
    the fastest of each (K, min_count). An early rung is too short to tell a 2% rate from a 5% one (none of
    30 sentences errs at either), so the fastest third can be all of the smallest sets, all over the budget
    at the last rung; the fastest of each set size keeps a larger set in the race."""
    reach = [r for r in rows if int(r["search_error_sentences"]) <= allowed]
    over = [str(r["label"]) for r in rows if int(r["search_error_sentences"]) > allowed]
    by_speed = sorted(reach, key=lambda r: -float(r[rank_key]))
    keep = [str(r["label"]) for r in by_speed[: math.ceil(len(rows) / eta)]]
    clean = [r for r in by_speed if int(r["search_error_sentences"]) == 0]
    per_size = {(r["k"], r["min_count"]): r for r in reversed(by_speed)}  # each one's fastest: the last wins
    hedges = clean[:1] + [per_size[key] for key in sorted(per_size)]
    for r in hedges:
        if str(r["label"]) not in keep:
            keep.append(str(r["label"]))
    return keep, over


def choose(
    rows: Sequence[dict[str, Any]], budget: float, rank_key: str, confidence: float = 0.0
) -> dict[str, Any]:
    """The fastest row (``rank_key``) whose search error rate's bound at ``confidence`` is within ``budget``;
    BudgetNotMet if none."""
    bound = {id(r): row_bound(r, confidence) for r in rows}
    within = [r for r in rows if bound[id(r)] <= budget + 1e-12]
    if not within:
        best = min(rows, key=lambda r: (bound[id(r)], -float(r[rank_key])))
        lowest = 100 * bound[id(best)]
        reachable = math.ceil(round(lowest * 10, 6)) / 10  # the lowest, rounded up to what --budget takes
        seen = f"{100 * float(best['search_errors']):.1f}% measured"
        level = f", bound {lowest:.1f}% at {100 * confidence:g}% confidence" if confidence else ""
        raise BudgetNotMet(
            f"no configuration is within the search-error budget of {100 * budget:g}% on the dev split: "
            f"the lowest is {best['label']} ({seen} on {best['sentences']} sentences{level}), so "
            f"--budget {reachable:g}% is reachable with these maps; to reach {100 * budget:g}%, build the "
            "maps from more states (dump.sentences in the config, then fastvocab run) or try larger K and "
            "min_count 1 (--k, --min-count); --by coverage says how many dumped sentences each setting needs"
        )
    return max(within, key=lambda r: float(r[rank_key]))


def run_tune(
    adapter: Seq2SeqAdapter,
    corpus: str | Path,
    files: Sequence[Path],
    direction: str,
    settings: TuneSettings,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Tune one direction (see the module's docstring). Returns ``{"rows": every measured row (with its
    ``rung``), "chosen": the chosen dev row, "chosen_map": its ClusterMap (normaliser attached),
    "test": the test-split row of the choice, "within_budget_on_test", "map_info", "candidates"}``.
    Raises BudgetNotMet (with the rows measured so far in ``.rows``) when nothing meets the budget."""
    note = on_note or (lambda _msg: None)
    src, _, tgt = direction.partition("-")
    recorded_k = read_shard_meta(files[0]).k
    cands = settings.candidates(recorded_k)
    rank_key = RANK_BY[settings.rank_by]
    rungs = settings.resolved_rungs
    sources, refs = _sentences(corpus, src, tgt, "dev", rungs[-1])
    if not sources:
        raise ValueError(f"the dev split of {direction} under {corpus} has no sentences")
    rungs = tuple(dict.fromkeys(min(n, len(sources)) for n in rungs))  # a small dev split: fewer rungs
    seqs = adapter.tokenize(sources, src, tgt)
    maps, map_info = build_candidate_maps(adapter, files, direction, cands, settings, note)
    full = make_projection(adapter, "full")
    scorer = Scorer(adapter, full, seqs, tgt, settings.max_len, settings.length_penalty)
    if rungs[-1] < settings.resolved_rungs[-1]:
        note(
            f"{direction}: the dev split has {len(sources)} sentences, fewer than the "
            f"{settings.resolved_rungs[-1]} that bound a {100 * settings.budget:g}% rate at "
            f"{100 * settings.confidence:g}% confidence"
        )
    allowed = allowed_errors(settings.budget, rungs[-1], settings.confidence)
    alive = list(cands)
    rows: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []
    for i, n in enumerate(rungs):
        note(f"{direction}: rung {i + 1}/{len(rungs)}: {len(alive)} candidates on {n} dev sentences")
        projs = {c: projection_for(adapter, c, maps[c.map_key], settings) for c in alive}
        final = i == len(rungs) - 1
        last = measure_candidates(
            adapter, full, projs, seqs[:n], refs[:n], src, tgt, settings, scorer, stable=final
        )
        if not final:
            keep, over = survivors(last, allowed, settings.eta, rank_key)
        for row in last:
            row["rung"] = i
            row["error_bound"] = round(row_bound(row, settings.confidence), 4)
            row["decided"] = (
                "final"
                if final
                else ("kept" if row["label"] in keep else ("errors" if row["label"] in over else "slower"))
            )
            if on_row is not None:
                on_row(row)
        rows += last
        if not final:
            if not keep:
                break  # nothing within reach of the budget: choose() below says so with the best seen
            alive = [c for c in alive if c.label in keep]
    try:
        chosen = choose(last, settings.budget, rank_key, settings.confidence)
    except BudgetNotMet as exc:
        exc.rows = rows  # type: ignore[attr-defined]
        raise
    cand = next(c for c in cands if c.label == chosen["label"])
    cmap = finish_map(adapter, maps[cand.map_key], settings.normaliser_rank)

    # The test split: does the budget hold on sentences the choice never saw?
    n_test = settings.test_sentences or rungs[-1]
    t_sources, t_refs = _sentences(corpus, src, tgt, "test", n_test)
    t_seqs = adapter.tokenize(t_sources, src, tgt)
    t_scorer = Scorer(adapter, full, t_seqs, tgt, settings.max_len, settings.length_penalty)
    note(f"{direction}: checking {cand.label} on {len(t_seqs)} test sentences")
    (test,) = measure_candidates(
        adapter,
        full,
        {cand: projection_for(adapter, cand, cmap, settings)},
        t_seqs,
        t_refs,
        src,
        tgt,
        settings,
        t_scorer,
        stable=True,
    )
    test["split"] = "test"
    return {
        "rows": rows,
        "chosen": chosen,
        "chosen_candidate": cand,
        "chosen_map": cmap,
        "test": test,
        "within_budget_on_test": float(test["search_errors"]) <= settings.budget + 1e-12,
        "map_info": {str(r): v for r, v in map_info.items()},
        "candidates": len(cands),
        "rungs": list(rungs),
        "allowed_error_sentences": allowed,
        "recorded_k": recorded_k,
    }


# ------------------------------------------------------------------------------------------------ reporting

TABLE_COLUMNS = (
    "rung",
    "sentences",
    "r",
    "k",
    "min_count",
    "probes",
    "selection",
    "identical",
    "search_errors",
    "error_bound",
    "bleu",
    "active_columns_per_row",
    "sent_per_s",
    "speed_ratio",
    "cpu_ratio",
    "decided",
)


def table_rows(rows: Sequence[dict[str, Any]]) -> list[list[object]]:
    return [[row.get(c) for c in TABLE_COLUMNS] for row in rows]


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    import csv

    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(TABLE_COLUMNS)
        w.writerows(table_rows(rows))
    return path


def markdown(result: dict[str, Any], settings: TuneSettings, direction: str) -> str:
    """The search as a Markdown page: the choice, the test check, every measured row."""
    ch, test = result["chosen"], result["test"]
    budget = 100 * settings.budget
    verdict = "within" if result["within_budget_on_test"] else "**ABOVE**"
    lines = [
        f"# fastvocab tune: {direction}, beam {settings.beam}, batch {settings.batch_size}",
        "",
        f"Budget: search error rate <= {budget:g}% on the dev split, its upper bound at "
        f"{100 * settings.confidence:g}% confidence. Rungs (dev sentences): "
        f"{result['rungs']}; {result['candidates']} candidates; ranked by {settings.rank_by}-time ratio.",
        "",
        f"Chosen: **{ch['label']}**: dev search errors {100 * float(ch['search_errors']):.1f}% "
        f"({ch['sentences']} sentences, bound {100 * float(ch['error_bound']):.1f}%), "
        f"speed {ch['speed_ratio']}x full (cpu {ch['cpu_ratio']}x).",
        "",
        f"Test split ({test['sentences']} sentences): search errors {100 * float(test['search_errors']):.1f}%"
        f" ({verdict} the budget), identical {100 * float(test['identical']):.1f}%, speed "
        f"{test['speed_ratio']}x full (cpu {test['cpu_ratio']}x), BLEU {test['bleu']} "
        f"(full {test['bleu_full']}).",
        "",
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|" + "---|" * len(TABLE_COLUMNS),
    ]
    for row in table_rows(result["rows"]):
        lines.append("| " + " | ".join("-" if v is None else str(v) for v in row) + " |")
    return "\n".join(lines) + "\n"

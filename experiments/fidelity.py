"""The fidelity yardstick: how far clustered decoding is from full softmax, per search setting.

Behind ``fastvocab bench fidelity``. For every direction (the test split
of a corpus), beam size and batch size it decodes the same sentences with the full projection and with each
method of :data:`METHODS`, in the same process (token ids, not text), and records against full softmax with
the same search and settings:

- ``identical``: share of sentences whose output token sequence equals full softmax's;
- ``search_errors``: Hoang et al.'s search error rate, the share of sentences whose output scores *lower*
  under the full model than full softmax's output (both scored by forced decoding with the full projection,
  ``decoding/scoring.py``, the search's length penalty); ``better``: differing outputs that score higher
  (full softmax's own beam search erred there);
- BLEU and chrF of full and of the method against the references (``tasks.evaluate.score``);
- active columns per decoder row (computed columns / rows, over every projection call; a row the exact
  method sends to the full projection counts its set plus N) and, for ``exact``, the certified fraction;
- sentences/s and target tokens/s of full and the method (decoding only: tokenization and model load
  excluded), every method run on each batch in turn (so load changes on a shared machine hit all alike),
  the median over ``repeats`` passes, and their ratio; also the ratio of process CPU time, steadier than
  wall time when other jobs share the cores.

Methods: ``default`` (what ``fastvocab translate --method clustered`` decodes with at that beam: no
inactive-mass estimate greedy, the stored normaliser in beam search; the one to quote for a map),
``clustered`` (the paper's union selection, no inactive-mass estimate at any beam), ``moments``, ``centroid``
and ``normaliser`` (the same with that ``inactive_mass``; beam > 1 only: greedy search reads logits only),
``oracle`` (a diagnostic: the exact mass of the columns not computed, from the full logits, so its search
errors are those of the sets alone), ``exact`` (the certificate, ``exact_k`` = 1 for greedy and 2 x beam
for beam search), ``per-row`` (per-row selection); a mass method with ``@R`` (``normaliser@8``) gives rows
farther than R from their centroid the exact mass, from their full logits (``mass_radius``; counted in
``full_rows_far``). Plain functions: no Ray, no MLflow; the callers print and write.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fastvocab import __version__
from fastvocab.artifacts_schema.cluster_map import ClusterMap, load_cluster_map, resolve_map_dir
from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.provenance import git_commit
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.scoring import sequence_scores
from fastvocab.decoding.search import ProjectionLike, decode
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels.base import Projection
from fastvocab.kernels.clustered_parts import exact_k_for
from fastvocab.kernels.cpu_features import cpu_name
from fastvocab.tasks.evaluate import score
from fastvocab.tasks.projections import clustered_options, make_projection

# The clustered projection's diagnostic inactive_mass (no CLI choice): the exact log-mass of the columns not
# computed, from the full logits of every row, so its search errors are those of the sets alone.
ORACLE_MASS = "oracle"
# "default": the options fastvocab translate picks at each beam (tasks.projections.clustered_options, auto)
METHODS = ("default", "clustered", "moments", "centroid", "normaliser", ORACLE_MASS, "exact", "per-row")
# an inactive-mass estimate (or the exact mass, ``oracle``: a diagnostic): beam search only
MASS_METHODS = ("moments", "centroid", "normaliser", ORACLE_MASS)
GRIDS = {"quick": ((1, 4), (32,)), "full": ((1, 2, 4, 5), (1, 32))}
DEFAULT_METHODS = ("clustered", "normaliser", "exact")
# Scores are float32 sums: a differing output counts as a search error only when it is worse by more than
# rounding (and as "better" only when better by more than rounding).
SCORE_TOL = 1e-5


def agreement(
    out: Sequence[Sequence[int]],
    full_out: Sequence[Sequence[int]],
    scores: Sequence[float],
    full_scores: Sequence[float],
) -> dict[str, Any]:
    """``identical``, ``search_errors`` (Hoang et al.: differs and scores lower under the full model) and
    ``better`` (differs and scores higher) as shares of the sentences; scores from :class:`Scorer`.

    ``differing``: ``[sentence, score gap]`` of every differing output, the gap being its full-model score
    minus full softmax's output's (negative: a search error), so a reader can tell near-ties (|gap| ~1e-4)
    from real losses."""
    differ = [a != b for a, b in zip(out, full_out, strict=True)]
    pairs = list(zip(differ, scores, full_scores, strict=True))
    n = len(differ)
    return {
        "identical": round(1 - sum(differ) / n, 4),
        "search_errors": round(sum(d and s < f - SCORE_TOL for d, s, f in pairs) / n, 4),
        "better": round(sum(d and s > f + SCORE_TOL for d, s, f in pairs) / n, 4),
        "differing": [[i, round(s - f, 5)] for i, (d, s, f) in enumerate(pairs) if d],
    }


@dataclass(frozen=True)
class FidelitySettings:
    """What one yardstick run measures."""

    beams: tuple[int, ...] = GRIDS["quick"][0]
    batches: tuple[int, ...] = GRIDS["quick"][1]
    methods: tuple[str, ...] = DEFAULT_METHODS
    selection: str = "union"
    probes: int | None = None  # union selection: each row adds its nearest clusters' sets (None: the map's)
    sentences: int = 50  # first N sentences of the split (0 = all)
    split: str = "test"
    max_len: int = SearchSettings.max_len
    length_penalty: float = SearchSettings.length_penalty
    repeats: int = 1  # timed passes per method (median reported)

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if method_base(m) not in METHODS]
        if bad:
            raise ValueError(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
        if not self.beams or not self.batches or min(*self.beams, *self.batches) < 1:
            raise ValueError(f"beam and batch sizes must be >= 1, got {self.beams} and {self.batches}")
        if self.repeats < 1 or self.sentences < 0 or self.max_len < 1 or self.probes == 0:
            raise ValueError(f"repeats, max_len and probes must be >= 1, sentences >= 0: {self}")


def method_base(method: str) -> str:
    """``normaliser@8`` -> ``normaliser``: a mass method with ``@R`` gives rows farther than R from their
    centroid the exact mass (``mass_radius``)."""
    base, _, radius = method.partition("@")
    if radius:
        try:
            ok = base in MASS_METHODS and float(radius) > 0
        except ValueError:
            ok = False
        if not ok:
            return method  # not a method: refused by the caller
    return base


def method_options(
    method: str,
    beam: int,
    selection: str,
    cluster_map: ClusterMap,
    probes: int | None = None,
    shortlist: str | Path | None = None,
) -> dict[str, object]:
    """The clustered projection's options for a yardstick method; ``shortlist``: the table whose candidates
    for the batch's sentences join every step's union (union selection only)."""
    opts: dict[str, object] = {"cluster_map": cluster_map, "selection": selection}
    if probes is not None:
        opts["probes"] = probes
    if shortlist is not None:
        if method == "per-row" or selection != "union":
            raise ValueError(f"a shortlist joins the batch's union: the {method} method does not take one")
        opts["shortlist"] = shortlist
    method, _, radius = method.partition("@")
    if radius:
        opts["mass_radius"] = float(radius)
    if method == "per-row":
        opts["selection"] = "per-row"
        opts.pop("probes", None)  # per-row reads each row's one cluster
    elif method in MASS_METHODS:
        opts["inactive_mass"] = method
    elif method == "exact":
        # the certificate examines every row here (what the yardstick reports), even where it does not pay
        opts.update(exact_k=exact_k_for(beam), full_when_cheaper=False)
    elif method == "default":
        opts.update(clustered_options(selection, "auto", False, beam, probes, shortlist is not None))
    return opts


def decode_all(
    adapter: Seq2SeqAdapter,
    projs: Mapping[str, ProjectionLike],
    seqs: Sequence[list[int]],
    src: str,
    tgt: str,
    beam: int,
    batch_size: int,
    max_len: int,
    length_penalty: float,
) -> tuple[dict[str, list[list[int]]], dict[str, float], dict[str, float]]:
    """Every projection on every batch, interleaved batch by batch (so a change of machine load hits all
    methods alike). Returns per method: outputs (token ids, prefix and EOS excluded) in input order, wall
    seconds and process CPU seconds of decoding (padding included, tokenization excluded)."""
    order = sorted(range(len(seqs)), key=lambda j: -len(seqs[j]))  # as tasks.translate: longest first
    search = SearchSettings(beam=beam, max_len=max_len, length_penalty=length_penalty)
    outs: dict[str, list[list[int]]] = {name: [[] for _ in seqs] for name in projs}
    wall = dict.fromkeys(projs, 0.0)
    cpu = dict.fromkeys(projs, 0.0)
    with torch.inference_mode():
        for lo in range(0, len(order), batch_size):
            chunk = order[lo : lo + batch_size]
            for name, proj in projs.items():
                t0, c0 = time.perf_counter(), time.process_time()
                batch = adapter.pad([seqs[j] for j in chunk])
                res = decode(adapter, proj, batch, src, tgt, search)
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
                for j, r in zip(chunk, res, strict=True):
                    outs[name][j] = r
    return outs, wall, cpu


@dataclass
class Passes:
    """What :func:`decode_passes` measured: the first pass's outputs, every pass's wall and process CPU
    seconds per projection, and the projections whose outputs changed between passes."""

    outputs: dict[str, list[list[int]]]
    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]
    unstable: set[str]


def decode_passes(
    adapter: Seq2SeqAdapter,
    projs: Mapping[str, ProjectionLike],
    seqs: Sequence[list[int]],
    args: tuple[str, str, int, int, int, float],
    repeats: int,
    after_pass: Callable[[int], None] = lambda rep: None,
    warm_up: bool = True,
) -> Passes:
    """``repeats`` passes of :func:`decode_all` over ``seqs`` (``args``: its src, tgt, beam, batch_size,
    max_len, length_penalty), every projection interleaved batch by batch.

    ``warm_up``: first an untimed pass over a few sentences (first-call allocations, the static engine's
    cache growth). Before each pass the counters of the projections that keep them (``reset_counters``,
    the clustered ones) are reset, so they describe one pass; ``after_pass(rep)`` runs after each pass (to
    read them, or other meters).
    """
    if warm_up:
        decode_all(adapter, projs, seqs[: min(len(seqs), args[3], 8)], *args)
    res = Passes({}, {n: [] for n in projs}, {n: [] for n in projs}, set())
    for rep in range(repeats):
        for p in projs.values():
            if hasattr(p, "reset_counters"):
                p.reset_counters()
        outs, wall, cpu = decode_all(adapter, projs, seqs, *args)
        for name in projs:
            res.wall[name].append(wall[name])
            res.cpu[name].append(cpu[name])
            if rep == 0:
                res.outputs[name] = outs[name]
            elif outs[name] != res.outputs[name]:
                res.unstable.add(name)
        after_pass(rep)
    return res


class Scorer:
    """Full-model scores of outputs, cached per (sentence, output): each distinct output is scored once."""

    def __init__(
        self,
        adapter: Seq2SeqAdapter,
        full: Projection,
        seqs: Sequence[list[int]],
        tgt: str,
        max_len: int,
        length_penalty: float,
        batch_size: int = 32,
    ) -> None:
        self.adapter, self.full, self.seqs, self.tgt = adapter, full, seqs, tgt
        self.max_len, self.lp, self.batch_size = max_len, length_penalty, batch_size
        self.cache: dict[tuple[int, tuple[int, ...]], float] = {}

    def scores(self, outputs: Sequence[Sequence[int]]) -> list[float]:
        todo = sorted({(i, tuple(o)) for i, o in enumerate(outputs)} - self.cache.keys())
        for lo in range(0, len(todo), self.batch_size):
            part = todo[lo : lo + self.batch_size]
            batch = self.adapter.pad([self.seqs[i] for i, _ in part])
            outs = [list(o) for _, o in part]
            ended = [len(o) < self.max_len for o in outs]  # an output cut at max_len has no EOS
            vals = sequence_scores(
                self.adapter, self.full, batch, self.tgt, outs, length_penalty=self.lp, ended=ended
            )
            self.cache.update(zip(part, vals, strict=True))
        return [self.cache[(i, tuple(o))] for i, o in enumerate(outputs)]


@dataclass
class Reference:
    """Full softmax's side of the comparison rows: its outputs (first pass), their full-model scores and
    BLEU/chrF, and its median wall and CPU seconds over the passes."""

    name: str
    outputs: list[list[int]]
    scores: list[float]
    quality: dict[str, float]
    seconds: float
    cpu_seconds: float

    @classmethod
    def of(
        cls, passes: Passes, name: str, scorer: Scorer, adapter: Seq2SeqAdapter, refs: Sequence[str]
    ) -> Reference:
        out = passes.outputs[name]
        return cls(
            name,
            out,
            scorer.scores(out),
            score(adapter.decode_ids(out), refs, scorer.tgt),
            statistics.median(passes.wall[name]),
            statistics.median(passes.cpu[name]),
        )

    def compare(
        self,
        passes: Passes,
        name: str,
        scorer: Scorer,
        adapter: Seq2SeqAdapter,
        refs: Sequence[str],
    ) -> dict[str, Any]:
        """The columns every yardstick row has (fidelity, tune, bench methods): agreement with full softmax
        (:func:`agreement`), BLEU/chrF of both, sentences and tokens per second of both, the speed ratios
        (wall and process CPU, medians) and every pass's wall seconds."""
        out = passes.outputs[name]
        q = self.quality if name == self.name else score(adapter.decode_ids(out), refs, scorer.tgt)
        sec, n = statistics.median(passes.wall[name]), len(out)
        return {
            **agreement(out, self.outputs, scorer.scores(out), self.scores),
            "bleu_full": round(self.quality["bleu"], 2),
            "bleu": round(q["bleu"], 2),
            "chrf_full": round(self.quality["chrf"], 2),
            "chrf": round(q["chrf"], 2),
            "sent_per_s_full": round(n / self.seconds, 2),
            "sent_per_s": round(n / sec, 2),
            "tok_per_s_full": round(sum(map(len, self.outputs)) / self.seconds, 1),
            "tok_per_s": round(sum(map(len, out)) / sec, 1),
            "speed_ratio": round(self.seconds / sec, 3),
            "cpu_ratio": round(self.cpu_seconds / statistics.median(passes.cpu[name]), 3),
            "seconds_full": [round(t, 3) for t in passes.wall[self.name]],
            "seconds": [round(t, 3) for t in passes.wall[name]],
        }


def measure_setting(
    scorer: Scorer,
    cmap: ClusterMap,
    refs: Sequence[str],
    src: str,
    beam: int,
    batch_size: int,
    settings: FidelitySettings,
    shortlist: str | Path | None = None,
) -> list[dict[str, Any]]:
    """One row per method of ``settings`` at this beam and batch size (see the module's docstring), on the
    sentences ``scorer`` scores: its model, full projection, tokenized sources and target language are
    the ones measured, from ``src``; ``refs``: their references."""
    adapter, full, seqs, tgt = scorer.adapter, scorer.full, scorer.seqs, scorer.tgt
    projs: dict[str, Projection] = {}
    for m in settings.methods:
        if method_base(m) in MASS_METHODS and beam == 1:
            continue  # greedy reads logits only: an inactive-mass estimate changes nothing
        opts = method_options(m, beam, settings.selection, cmap, settings.probes, shortlist)
        projs[m] = make_projection(adapter, "clustered", **opts)
    everything = {"full": full, **projs}
    args = (src, tgt, beam, batch_size, settings.max_len, settings.length_penalty)
    passes = decode_passes(adapter, everything, seqs, args, settings.repeats)
    ref = Reference.of(passes, "full", scorer, adapter, refs)
    rows = []
    for name, p in projs.items():
        stats = p.stats()
        cols, cert = stats["active_columns_per_row"], stats["certified_fraction"]
        rows.append(
            {
                "direction": f"{src}-{tgt}",
                "beam": beam,
                "batch": batch_size,
                "method": name,
                "options": p.options(),
                "sentences": len(passes.outputs[name]),
                **ref.compare(passes, name, scorer, adapter, refs),
                "active_columns_per_row": None if cols is None else round(cols, 1),
                "certified": None if cert is None else round(cert, 4),
                "full_rows_far": None if stats["far_fraction"] is None else round(stats["far_fraction"], 4),
                "cpu_seconds_full": [round(t, 3) for t in passes.cpu["full"]],
                "cpu_seconds": [round(t, 3) for t in passes.cpu[name]],
                "unstable_across_repeats": name in passes.unstable,
            }
        )
    return rows


def run_fidelity(
    adapter: Seq2SeqAdapter,
    corpus: str | Path,
    maps: str | Path,
    directions: Sequence[str],
    settings: FidelitySettings,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    shortlists: Mapping[str, str | Path] | None = None,
) -> list[dict[str, Any]]:
    """Every direction x beam x batch x method of ``settings``; ``on_row`` sees each row as it is done.
    ``shortlists``: a shortlist table by direction, joined to the clustered methods' sets (as ``fastvocab
    translate --with-shortlist``)."""
    full = make_projection(adapter, "full")
    results: list[dict[str, Any]] = []
    for direction in directions:
        src, _, tgt = direction.partition("-")
        limit = settings.sentences or None
        _, sources, refs = read_direction(corpus, src, tgt, settings.split, limit=limit)
        keep = [i for i, s in enumerate(sources) if s.strip()]
        sources, refs = [sources[i] for i in keep], [refs[i] for i in keep]
        cmap = load_cluster_map(resolve_map_dir(maps, src, tgt), expect_fingerprint=adapter.fingerprint)
        mf = cmap.manifest  # what the map covers, with each row: beams beyond them are measured too
        covers = {"r": mf.r, "k": mf.k, "beams": mf.beams, "states": mf.states_used}
        seqs = adapter.tokenize(sources, src, tgt)
        for beam in settings.beams:
            for batch_size in settings.batches:
                scorer = Scorer(adapter, full, seqs, tgt, settings.max_len, settings.length_penalty)
                rows = measure_setting(
                    scorer, cmap, refs, src, beam, batch_size, settings, (shortlists or {}).get(direction)
                )
                for row in rows:
                    row["map"] = covers
                    if on_row is not None:
                        on_row(row)
                results += rows
    return results


def format_row(row: dict[str, Any]) -> str:
    """One line of the results table (see :data:`TABLE_HEADER`)."""
    cols = row["active_columns_per_row"]
    cert = row["certified"] if row["certified"] is not None else row.get("full_rows_far")  # exact | R
    return (
        f"{row['direction']:<6} {row['beam']:>4} {row['batch']:>5} {row['method']:<10} "
        f"{row['identical']:>9.3f} {row['search_errors']:>7.3f} "
        f"{row['bleu_full']:>6.2f} {row['bleu']:>6.2f} "
        f"{'-' if cols is None else f'{cols:.0f}':>9} {'-' if cert is None else f'{cert:.3f}':>6} "
        f"{row['sent_per_s_full']:>7.2f} {row['sent_per_s']:>7.2f} {row['speed_ratio']:>6.2f}"
    )


TABLE_HEADER = (
    f"{'dir':<6} {'beam':>4} {'batch':>5} {'method':<10} {'identical':>9} {'s.err':>7} "
    f"{'BLEU_f':>6} {'BLEU':>6} {'cols/row':>9} {'cert':>6} {'sent/s_f':>7} {'sent/s':>7} {'ratio':>6}"
)


def fidelity_record(
    results: list[dict[str, Any]],
    machine: dict[str, Any],
    *,
    command: str,
    settings: FidelitySettings,
    model: str,
    maps: str,
    directions: Sequence[str],
    seconds: float,
    extra_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON record of a yardstick run: command, meta (``machine``: :func:`run_meta`'s when, where and
    which model; the settings, the load) and results."""
    return {
        "benchmark": "fidelity",
        "command": command,
        "meta": {
            **machine,
            "fastvocab_version": __version__,
            "model": model,
            "maps": maps,
            "directions": list(directions),
            **asdict(settings),
            "seconds_total": round(seconds, 1),
            "score_tolerance": SCORE_TOL,
            **(extra_meta or {}),
        },
        "results": results,
    }


def run_meta(
    adapter: Seq2SeqAdapter,
    device: str,
    load_before: Sequence[float],
    *,
    threads: int | None = None,
    finished: bool = True,
) -> dict[str, Any]:
    """The meta every benchmark record starts with: when, from which commit, on what (device, torch,
    threads, load average before and, once ``finished``, after the run) and which model (fingerprint,
    vocabulary, width, dtype)."""
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device_description(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads() if threads is None else threads,
        "cpu_count": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "commit": git_commit(cwd=Path(__file__).resolve().parent),
    }
    if finished:
        meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return {
        **meta,
        "model_fingerprint": adapter.fingerprint,
        "n_vocab": adapter.n_vocab,
        "d": adapter.d_model,
        "dtype": str(adapter.dtype),
    }


def device_description(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU's model and extensions and torch's thread count."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"

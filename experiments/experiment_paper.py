"""The experiments of Amer et al. (2022) on a given model and its directions: ``fastvocab experiment paper``.

Each table and figure of the paper's Sections 2.2, 3.2, 3.3 and 3.5, measured on the user's model, corpus and
pipeline outputs (the maps and the stored hidden states of a work dir), from pieces that exist elsewhere:

- Tables 2-5 come from :func:`fastvocab.experiments.bench_methods.run_bench` with the methods ``full`` and
  ``clustered`` (the work dir's maps; union selection, the paper's ``inactive_mass`` none by default), once
  per search setting of the paper (beam 1 batch 1, beam 2 batch 20) on the test split ("set 1") and once at
  beam 2 batch 20 on the dev split ("set 2", Table 4). Every number is that harness's: identical-output rate
  and search error rate (``fidelity.agreement``), BLEU (sacrebleu), tokens/s of both methods
  interleaved batch by batch, time inside the output layer per call, active columns per call (the union's
  share of the vocabulary), peak RSS per method (``measure_peak``) and the map's size on disk.
- Figures 2-4 re-cluster stored states (``tasks/kmeans.py`` ``train_kmeans``; ``tasks/maps.py`` ``assign``,
  ``ActiveSetCounter``, ``make_cluster_map``) at several r and K without dumping again; a direction with no
  stored states (Figure 2's target-only pool, e.g. fr-en and es-en into en) is dumped once into a cache folder
  with the dump stage's own decoder (``tasks/dump.py``), resumable shard by shard.

  - Figure 2: the largest active set of any cluster (% of the vocabulary) against r, at K = ``fig2_k``, for a
    map of one direction (source and target known) and for a map pooling every direction into its target
    (target only known), each direction contributing the states of the same number of sentences;
  - Figure 3: speed of clustered decoding relative to full softmax (tokens/s, %; the paper's "speed
    percentage") against r, one curve per K, on the dev split at beam 2 batch 20; full and the three K maps
    of one r are decoded interleaved batch by batch, so each r has its own same-run baseline;
  - Figure 4: the active share of every cluster, by centroid index, at r = ``fig4_r`` for each K.

Plain functions, no Ray and no MLflow (``pipeline/commands/experiment.py`` logs). Presets: ``full`` is the
paper's grid (r 100-500 step 100, r 100-2000 step 100, K 1/3/5, r = 1300, whole splits), ``quick`` keeps every
axis but samples it (minutes on 2 CPU cores).
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.fingerprint import ModelRef
from fastvocab.artifacts_schema.hidden_states import (
    fixed_list_to_numpy,
    iter_batches,
    read_shard_meta,
    validate_direction,
)
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.settings import SearchSettings
from fastvocab.experiments.bench_methods import BenchSettings, Metered, measure_beam, run_bench, span
from fastvocab.experiments.fidelity import Scorer
from fastvocab.kernels.id_sets import unique_ids
from fastvocab.tasks.kmeans import train_kmeans
from fastvocab.tasks.maps import ActiveSetCounter, MapParams, assign, centroid_sq_norms, make_cluster_map
from fastvocab.tasks.projections import make_projection

log = logging.getLogger(__name__)

PARTS = ("table2", "table3", "table4", "table5", "figure2", "figure3", "figure4")
# Parts measured by the same decoding runs (tables) and by re-clustering stored states (figures).
TABLE_PARTS = ("table2", "table3", "table4", "table5")
SET1, SET2 = "test", "dev"  # the paper's validation "set 1" and "set 2" (Table 4)


@dataclass(frozen=True)
class PaperSettings:
    """What one ``experiment paper`` run measures; :data:`PRESETS` holds the paper's grid and a quick one."""

    directions: tuple[str, ...] = ("en-it", "it-en")  # Tables 2-5
    settings: tuple[tuple[int, int], ...] = ((1, 1), (2, 20))  # (beam, batch) of Tables 2, 3 and 5
    set2_setting: tuple[int, int] = (2, 20)  # Table 4
    sentences: int = 0  # first N sentences of the test split (0: all)
    set2_sentences: int = 0  # first N of the dev split (0: all)
    inactive_mass: str = "none"  # the paper's: softmax over the active columns only
    max_len: int = SearchSettings.max_len
    length_penalty: float = SearchSettings.length_penalty
    repeats: int = 1  # timed passes per setting, median reported
    fig_direction: str = "it-en"  # Figures 2-4 (the paper's ItEn)
    fig2_pool: tuple[str, ...] = (
        "fr-en",
        "es-en",
    )  # more directions into the same target (target only known)
    fig2_rs: tuple[int, ...] = (100, 200, 300, 400, 500)
    fig2_k: int = 1
    fig2_sentences: int = 1500  # source sentences per direction whose states build the Figure 2 maps
    fig3_rs: tuple[int, ...] = tuple(range(100, 2001, 100))
    ks: tuple[int, ...] = (1, 3, 5)  # Figures 3 and 4
    fig3_setting: tuple[int, int] = (2, 20)
    fig3_sentences: int = 0  # first N sentences of the dev split decoded per r (0: all)
    fig_state_sentences: int = 0  # sentences whose stored states build the Figure 3-4 maps (0: all stored)
    fig4_r: int = 1300
    niter: int = 20  # k-means iterations (the paper: 20)
    seed: int = 1234
    max_points_per_centroid: int = 256
    kmeans_threads: int | None = None
    dump_batch_size: int = 32  # a direction dumped for Figure 2 (as the pipeline's dump defaults)
    dump_split: str = "train"

    def __post_init__(self) -> None:
        pairs = [*self.settings, self.set2_setting, self.fig3_setting]
        if not self.settings or min(min(p) for p in pairs) < 1:
            raise ValueError(f"beam and batch sizes must be >= 1, got {pairs}")
        rs = [*self.fig2_rs, *self.fig3_rs, self.fig4_r]
        if not self.fig2_rs or not self.fig3_rs or min(rs) < 1:
            raise ValueError(f"numbers of clusters must be >= 1, got {rs}")
        if not self.ks or min(*self.ks, self.fig2_k) < 1:
            raise ValueError(f"K must be >= 1, got {self.ks} and {self.fig2_k}")
        if min(self.repeats, self.max_len, self.niter, self.fig2_sentences) < 1:
            raise ValueError(f"repeats, max_len, niter and fig2_sentences must be >= 1: {self}")
        if min(self.sentences, self.set2_sentences, self.fig3_sentences, self.fig_state_sentences) < 0:
            raise ValueError(f"sentence counts must be >= 0: {self}")
        for d in (*self.directions, self.fig_direction, *self.fig2_pool):
            src, sep, tgt = d.partition("-")
            if not (src and sep and tgt):
                raise ValueError(f"direction must look like 'en-it', got {d!r}")
        if any(d.split("-", 1)[1] != self.fig_direction.split("-", 1)[1] for d in self.fig2_pool):
            raise ValueError(
                f"Figure 2's pool {self.fig2_pool} must translate into {self.fig_direction}'s target"
            )

    @property
    def max_k(self) -> int:
        return max(*self.ks, self.fig2_k)

    def describe(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


PRESETS: dict[str, PaperSettings] = {
    "full": PaperSettings(),
    # Every axis of the paper's grids, sampled: 3 of Figure 2's r, 4 of Figure 3's (1300 among them, so
    # Figure 4 reuses its maps), a few batches of each split. About 10 CPU-minutes on the demo model.
    "quick": PaperSettings(
        sentences=30,
        set2_sentences=40,
        fig2_rs=(100, 300, 500),
        fig2_sentences=500,
        fig3_rs=(100, 700, 1300, 2000),
        fig3_sentences=40,
        fig_state_sentences=1000,
    ),
}


@dataclass
class PaperResult:
    """Every part's rows (JSON-able) and the per-cluster fractions Figure 4 plots."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    bench_rows: list[dict[str, Any]] = field(default_factory=list)  # run_bench's rows behind Tables 2-5
    fig2: list[dict[str, Any]] = field(default_factory=list)
    fig3: list[dict[str, Any]] = field(default_factory=list)
    fig4: dict[int, np.ndarray] = field(default_factory=dict)  # K -> (r,) active fraction per cluster
    states: dict[str, dict[str, Any]] = field(default_factory=dict)  # where each direction's states came from
    seconds: dict[str, float] = field(default_factory=dict)
    # part -> when its work started and ended (seconds since the epoch): its MLflow run's span
    spans: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)


Note = Callable[[str], None]


def _quiet(_msg: str) -> None:
    return None


# ------------------------------------------------------------------------------------------------ Tables 2-5


def bench_settings(
    settings: PaperSettings, beam: int, batch: int, split: str, sentences: int
) -> BenchSettings:
    """``bench methods`` settings for one (beam, batch, split): full and the paper's clustered method."""
    return BenchSettings(
        methods=("full", "clustered"),
        beams=(beam,),
        batch_size=batch,
        sentences=sentences,
        split=split,
        max_len=settings.max_len,
        length_penalty=settings.length_penalty,
        repeats=settings.repeats,
        points={"clustered": [{"inactive_mass": settings.inactive_mass}]},
    )


def run_tables(
    adapter: Seq2SeqAdapter,
    corpus: str | Path,
    maps: str | Path,
    settings: PaperSettings,
    parts: Sequence[str] = TABLE_PARTS,
    note: Note = _quiet,
) -> list[dict[str, Any]]:
    """The decoding runs behind Tables 2-5: ``run_bench`` rows tagged with ``set`` (1: test, 2: dev)."""
    runs: list[tuple[int, int, int, str, int]] = []
    if any(p in parts for p in ("table2", "table3", "table5")):
        runs += [(1, b, n, SET1, settings.sentences) for b, n in settings.settings]
    if "table4" in parts:
        b, n = settings.set2_setting
        runs.append((2, b, n, SET2, settings.set2_sentences))
    rows: list[dict[str, Any]] = []
    for set_no, beam, batch, split, sentences in runs:
        note(f"tables: set {set_no} ({split}), beam {beam}, batch {batch}")
        bs = bench_settings(settings, beam, batch, split, sentences)
        for row in run_bench(adapter, corpus, maps, settings.directions, bs):
            rows.append({"set": set_no, "split": split, **row})
    return rows


def _pairs(
    rows: Sequence[dict[str, Any]], set_no: int, beam: int, batch: int
) -> dict[str, tuple[dict, dict]]:
    """direction -> (full row, clustered row) of one decoding run."""
    out: dict[str, tuple[dict, dict]] = {}
    for direction in dict.fromkeys(str(r["direction"]) for r in rows):
        sub = [r for r in rows if r["direction"] == direction and r["set"] == set_no]
        sub = [r for r in sub if r["beam"] == beam and r["batch"] == batch]
        full = next((r for r in sub if r["method"] == "full"), None)
        clus = next((r for r in sub if r["method"] == "clustered"), None)
        if full is not None and clus is not None:
            out[direction] = (full, clus)
    return out


def speedup_pct(full: dict[str, Any], clus: dict[str, Any]) -> float:
    """The paper's speed percentage: tokens/s of the method over full softmax's, minus 1, in %."""
    return round(100.0 * (float(clus["tok_per_s"]) / float(full["tok_per_s_full"]) - 1.0), 2)


def _per_call_us(row: dict[str, Any]) -> float | None:
    calls = row.get("projection_calls") or 0
    return round(1e6 * float(row["projection_seconds"]) / calls, 1) if calls else None


def _averages(rows: list[dict[str, Any]], key: str = "direction") -> list[dict[str, Any]]:
    """The paper's EX AVG (from English) and XE AVG (into English) rows, where the table has such rows."""
    out = []
    for name, pick in (("EX AVG", lambda d: d.startswith("en-")), ("XE AVG", lambda d: d.endswith("-en"))):
        sub = [r for r in rows if pick(str(r[key]))]
        if not sub:
            continue
        avg: dict[str, Any] = {key: name}
        for col, v in sub[0].items():
            if col != key and isinstance(v, (int, float)) and not isinstance(v, bool):
                vals = [float(r[col]) for r in sub if isinstance(r.get(col), (int, float))]
                avg[col] = round(sum(vals) / len(vals), 2) if vals else None
            elif col != key:
                avg[col] = ""
        out.append(avg)
    return out


def table2(rows: Sequence[dict[str, Any]], settings: PaperSettings) -> list[dict[str, Any]]:
    """Active percentage and projection time per call, full vs clustered, per direction and search setting."""
    out = []
    for beam, batch in settings.settings:
        for direction, (full, clus) in _pairs(rows, 1, beam, batch).items():
            full_us, clus_us = _per_call_us(full), _per_call_us(clus)
            out.append(
                {
                    "direction": direction,
                    "beam": beam,
                    "batch": batch,
                    "active_pct": round(100.0 * float(clus["candidate_fraction"]), 3),
                    "active_columns": clus["candidates_per_row"],
                    "n_vocab": round(float(full["candidates_per_row"])),
                    "full_us": full_us,
                    "clustered_us": clus_us,
                    "projection_speedup_x": round(full_us / clus_us, 2) if full_us and clus_us else None,
                    "calls": clus["projection_calls"],
                }
            )
    return out


def table3(rows: Sequence[dict[str, Any]], settings: PaperSettings) -> list[dict[str, Any]]:
    """BLEU full vs clustered, end-to-end speed-up, identical-output and search error rates, per direction:
    one column group per search setting (set 1)."""
    by_dir: dict[str, dict[str, Any]] = {}
    for beam, batch in settings.settings:
        tag = f"b{beam}_n{batch}"
        for direction, (full, clus) in _pairs(rows, 1, beam, batch).items():
            row = by_dir.setdefault(direction, {"direction": direction})
            row.update(_quality(full, clus, tag))
    out = list(by_dir.values())
    return out + _averages(out)


def _quality(full: dict[str, Any], clus: dict[str, Any], tag: str) -> dict[str, Any]:
    return {
        f"bleu_full_{tag}": clus["bleu_full"],
        f"bleu_clus_{tag}": clus["bleu"],
        f"speedup_pct_{tag}": speedup_pct(full, clus),
        f"identical_pct_{tag}": round(100.0 * float(clus["identical"]), 1),
        f"search_err_pct_{tag}": round(100.0 * float(clus["search_errors"]), 1),
        f"sentences_{tag}": clus["sentences"],
    }


def table4(rows: Sequence[dict[str, Any]], settings: PaperSettings) -> list[dict[str, Any]]:
    """Table 3's columns on set 2 (the dev split) at the paper's beam 2, batch 20."""
    beam, batch = settings.set2_setting
    out = []
    for direction, (full, clus) in _pairs(rows, 2, beam, batch).items():
        out.append({"direction": direction, **_quality(full, clus, f"b{beam}_n{batch}")})
    return out + _averages(out)


def table5(rows: Sequence[dict[str, Any]], settings: PaperSettings) -> list[dict[str, Any]]:
    """Peak RSS of the process while each method decodes (the harness's warm-up sentences), and the map's
    size on disk, at the last search setting of set 1 (the paper's beam 2, batch 20)."""
    beam, batch = settings.settings[-1]
    out = []
    for direction, (full, clus) in _pairs(rows, 1, beam, batch).items():
        out.append(
            {
                "direction": direction,
                "beam": beam,
                "batch": batch,
                "rss_peak_full_mib": full["rss_peak_mib"],
                "rss_peak_clustered_mib": clus["rss_peak_mib"],
                "rss_delta_full_mib": full["rss_delta_mib"],
                "rss_delta_clustered_mib": clus["rss_delta_mib"],
                "map_bytes": clus["artifact_bytes"],
                "memory_method": full["memory_method"],
            }
        )
    return out


TABLES = {"table2": table2, "table3": table3, "table4": table4, "table5": table5}


def table_sources(name: str, rows: Sequence[dict[str, Any]], settings: PaperSettings) -> list[dict[str, Any]]:
    """The decoding runs' rows a table is made from: set 2 at its setting for Table 4, set 1 at the last
    setting for Table 5, set 1 at every setting for Tables 2 and 3."""
    set_no, pairs = {
        "table4": (2, [settings.set2_setting]),
        "table5": (1, [settings.settings[-1]]),
    }.get(name, (1, list(settings.settings)))
    wanted = {tuple(pair) for pair in pairs}
    return [r for r in rows if r["set"] == set_no and (r["beam"], r["batch"]) in wanted]


# ------------------------------------------------------------------------------------------------ states


@dataclass
class States:
    """The stored states of a direction (or a pool), in memory: hidden (n, d) float32, top-K ids (n, K)."""

    hidden: np.ndarray
    topk: np.ndarray
    sentences: int
    source: str

    @staticmethod
    def concat(parts: Sequence[States], source: str) -> States:
        """One pool of ``parts``' states; their top-K ids are cut to the smallest K among them (a run's dump
        records 2 x its largest beam, a dump made here ``max_k``; ids are stored best first)."""
        k = min(p.topk.shape[1] for p in parts)
        return States(
            np.concatenate([p.hidden for p in parts]),
            np.concatenate([p.topk[:, :k] for p in parts]),
            sum(p.sentences for p in parts),
            source,
        )


def load_states(files: Sequence[Path], max_sentences: int = 0, source: str = "") -> States:
    """The states of the first ``max_sentences`` sentences (0: all) of a direction's shards, in shard order.

    Loads them (this is an experiment over a sample: ``fig2_sentences`` / ``fig_state_sentences`` bound it).
    """
    meta = read_shard_meta(files[0])
    hidden, topk = [], []
    allowed: set[int] = set()
    seen = 0
    for batch in iter_batches(list(files), columns=["sent_id", "hidden", "topk_ids"]):
        sent = batch.column("sent_id").to_numpy()
        if max_sentences:
            # Rows are in sentence order within a shard: admit new sentences until the budget is spent.
            for s in dict.fromkeys(sent.tolist()):
                if s not in allowed and seen < max_sentences:
                    allowed.add(s)
                    seen += 1
            keep = np.isin(sent, np.fromiter(allowed, dtype=np.int64, count=len(allowed)))
        else:
            allowed.update(unique_ids(np.asarray(sent)).tolist())
            keep = np.ones(len(sent), dtype=bool)
        if keep.any():
            hidden.append(fixed_list_to_numpy(batch.column("hidden"), meta.d, np.float32)[keep])
            topk.append(fixed_list_to_numpy(batch.column("topk_ids"), meta.k, np.int32)[keep])
        if max_sentences and seen >= max_sentences and not keep[-1]:
            break
    if not hidden:
        raise ArtifactError(f"no states in {files[0].parent}")
    return States(np.concatenate(hidden), np.concatenate(topk), len(allowed), source or str(files[0].parent))


def find_states(roots: Sequence[Path], direction: str, fingerprint: str, k: int) -> list[Path] | None:
    """The shards of ``direction`` in the first root that has valid ones for this model with K >= ``k``."""
    for root in roots:
        try:
            files = validate_direction(root, direction, fingerprint)
        except ArtifactError:
            continue
        if read_shard_meta(files[0]).k >= k:
            return files
    return None


def has_sources(corpus: str | Path, direction: str, split: str) -> bool:
    """Whether ``corpus`` holds source text for ``direction``: its pair split (either orientation) or the
    source language's monolingual file."""
    from fastvocab.artifacts_schema.corpus import split_path

    src, _, tgt = direction.partition("-")
    if split_path(corpus, src, tgt, split).exists() or split_path(corpus, tgt, src, split).exists():
        return True
    return (Path(corpus) / "mono" / f"{src}.parquet").exists()


def dump_direction(
    model: ModelRef,
    device: str,
    corpus: str | Path,
    direction: str,
    sentences: int,
    cache: Path,
    settings: PaperSettings,
    note: Note = _quiet,
) -> list[Path]:
    """Dump ``direction``'s first ``sentences`` source sentences into ``cache`` with the dump stage's decoder
    (greedy, full softmax, top-``max_k``); shards already there for the same plan are kept. The sources are
    the ``dump_split`` of the pair when the corpus has it, else the source language's monolingual file
    (``<corpus>/mono/<src>.parquet``, ``fastvocab corpus --mono``): a state needs no reference."""
    from fastvocab.artifacts_schema.corpus import read_mono, split_path
    from fastvocab.tasks.context import RunContext
    from fastvocab.tasks.dump import DumpDecoder, DumpSettings, plan_shards, run_dump_shard

    src, _, tgt = direction.partition("-")
    pair = split_path(corpus, src, tgt, settings.dump_split).exists()
    if pair or split_path(corpus, tgt, src, settings.dump_split).exists():
        ids, texts, _ = read_direction(corpus, src, tgt, settings.dump_split, limit=sentences)
    else:
        ids, texts = read_mono(corpus, src, limit=sentences)
    if not texts:
        raise ValueError(f"no source sentences for {direction} in {corpus}")
    dump = DumpSettings(
        k=max(settings.max_k, 5), max_len=settings.max_len, batch_size=settings.dump_batch_size
    )
    decoder = DumpDecoder(RunContext(model, device), dump)
    for spec in plan_shards(direction, list(ids), list(texts), 500):
        res = run_dump_shard(decoder, spec, cache)
        note(f"states {direction} shard {spec.index}: {'kept' if res['skipped'] else 'dumped'}")
    return validate_direction(cache, direction, model.fingerprint)


# ------------------------------------------------------------------------------------------------ maps


def kmeans(states: States, r: int, settings: PaperSettings) -> np.ndarray:
    """r centroids of the states (Faiss, the pipeline's k-means settings)."""
    centroids, _ = train_kmeans(
        states.hidden,
        r,
        niter=settings.niter,
        seed=settings.seed,
        max_points_per_centroid=settings.max_points_per_centroid,
        threads=settings.kmeans_threads,
    )
    return centroids


def active_counters(
    states: States, centroids: np.ndarray, ks: Sequence[int], n_vocab: int
) -> dict[int, ActiveSetCounter]:
    """(cluster, token) counts at each K from one assignment of the states (Eq. 2)."""
    cluster_ids = assign(states.hidden, centroids, centroid_sq_norms(centroids))
    counters = {}
    for k in ks:
        counters[k] = ActiveSetCounter(len(centroids), n_vocab)
        counters[k].add(cluster_ids, states.topk[:, :k])  # ids stored best first
    return counters


def set_fractions(counter: ActiveSetCounter) -> np.ndarray:
    """Active share of the vocabulary per cluster, (r,)."""
    return np.diff(counter.to_csr()[0]).astype(np.float64) / counter.n_vocab


# ------------------------------------------------------------------------------------------------ figures


def figure2(
    direction_states: States, pooled: States, settings: PaperSettings, n_vocab: int, note: Note = _quiet
) -> list[dict[str, Any]]:
    """Largest (and mean) active set against r at K = ``fig2_k``, for both ways of building the maps."""
    rows = []
    for scope, states in (("source+target", direction_states), ("target only", pooled)):
        for r in settings.fig2_rs:
            if len(states.hidden) < r:
                note(f"figure 2: {scope} has {len(states.hidden)} states, fewer than r={r}: skipped")
                continue
            t0 = time.perf_counter()
            counter = active_counters(states, kmeans(states, r, settings), (settings.fig2_k,), n_vocab)[
                settings.fig2_k
            ]
            frac = set_fractions(counter)
            rows.append(
                {
                    "scope": scope,
                    "r": r,
                    "k": settings.fig2_k,
                    "max_active_pct": round(100.0 * float(frac.max()), 3),
                    "mean_active_pct": round(100.0 * float(frac.mean()), 3),
                    "states": len(states.hidden),
                    "sentences": states.sentences,
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
            note(f"figure 2: {scope} r={r}: max {rows[-1]['max_active_pct']}%")
    return rows


def figure3_and_4(
    adapter: Seq2SeqAdapter,
    corpus: str | Path,
    states: States,
    settings: PaperSettings,
    note: Note = _quiet,
) -> tuple[list[dict[str, Any]], dict[int, np.ndarray]]:
    """Figure 3's rows (speed against r per K, with agreement and BLEU) and Figure 4's per-cluster fractions.

    Per r: k-means once, one assignment, a map per K (in memory), then full softmax and the K maps decode the
    dev sentences interleaved batch by batch (``bench_methods.measure_beam``), so each r has a same-run
    baseline. Figure 4 reuses the maps of ``fig4_r`` when it is on Figure 3's grid.
    """
    src, _, tgt = settings.fig_direction.partition("-")
    beam, batch = settings.fig3_setting
    _, sources, refs = read_direction(corpus, src, tgt, SET2, limit=settings.fig3_sentences or None)
    keep = [i for i, s in enumerate(sources) if s.strip()]
    sources, refs = [sources[i] for i in keep], [refs[i] for i in keep]
    seqs = adapter.tokenize(sources, src, tgt)
    full = make_projection(adapter, "full")
    bs = BenchSettings(
        methods=("full", "clustered"),
        beams=(beam,),
        batch_size=batch,
        max_len=settings.max_len,
        length_penalty=settings.length_penalty,
        repeats=settings.repeats,
    )
    scorer = Scorer(adapter, full, seqs, tgt, settings.max_len, settings.length_penalty)
    sync = adapter.device.type == "cuda"
    rows: list[dict[str, Any]] = []
    fig4: dict[int, np.ndarray] = {}
    rs = list(settings.fig3_rs) + ([] if settings.fig4_r in settings.fig3_rs else [settings.fig4_r])
    for r in rs:
        if len(states.hidden) < r:
            note(f"figure 3: {len(states.hidden)} states, fewer than r={r}: skipped")
            continue
        t0 = time.perf_counter()
        centroids = kmeans(states, r, settings)
        counters = active_counters(states, centroids, settings.ks, adapter.n_vocab)
        kmeans_s = time.perf_counter() - t0
        if r == settings.fig4_r:
            fig4 = {k: set_fractions(c) for k, c in counters.items()}
        if r not in settings.fig3_rs:
            continue
        projs: dict[str, tuple[str, dict[str, Any], Metered]] = {"full": ("full", {}, Metered(full, sync))}
        for k, counter in counters.items():
            cmap = make_cluster_map(
                centroids,
                counter,
                MapParams(scope="direction", k=k),
                model_fingerprint=adapter.fingerprint,
                name=settings.fig_direction,
                niter=settings.niter,
                seed=settings.seed,
            )
            proj = make_projection(
                adapter,
                "clustered",
                cluster_map=cmap,
                selection="union",
                inactive_mass=settings.inactive_mass,
            )
            projs[f"r={r} K={k}"] = ("clustered", {"r": r, "k": k}, Metered(proj, sync))
        measured = measure_beam(adapter, projs, {}, seqs, refs, src, tgt, beam, bs, scorer)
        for row in measured:
            if row["method"] != "clustered":
                continue
            k = int(row["point"]["k"])  # type: ignore[index]
            frac = set_fractions(counters[k])
            rows.append(
                {
                    "r": r,
                    "k": k,
                    "speed_pct": speedup_pct(row, row),
                    "speed_ratio": round(float(row["tok_per_s"]) / float(row["tok_per_s_full"]), 3),
                    "cpu_ratio": row["cpu_ratio"],
                    "tok_per_s": row["tok_per_s"],
                    "tok_per_s_full": row["tok_per_s_full"],
                    "active_pct": round(100.0 * float(row["candidate_fraction"]), 3),
                    "mean_set_pct": round(100.0 * float(frac.mean()), 3),
                    "identical_pct": round(100.0 * float(row["identical"]), 1),
                    "search_err_pct": round(100.0 * float(row["search_errors"]), 1),
                    "bleu_full": row["bleu_full"],
                    "bleu": row["bleu"],
                    "sentences": row["sentences"],
                    "kmeans_seconds": round(kmeans_s, 2),
                }
            )
            note(
                f"figure 3: r={r} K={k}: speed {rows[-1]['speed_pct']:+.1f}%, "
                f"active {rows[-1]['active_pct']}%"
            )
    return rows, fig4


# ------------------------------------------------------------------------------------------------ the run


@dataclass(frozen=True)
class PaperData:
    """Where ``experiment paper`` reads and keeps its data.

    ``corpus``: the test and dev splits decoded; ``maps``: the maps of Tables 2-5; ``states_roots`` are
    searched in order for a direction's stored states (the pipeline's ``states`` folder first); a direction
    found in none is dumped into ``cache`` (which is searched too), its sources read from ``pool_corpus``
    (None: ``corpus``): a pair split or a monolingual file."""

    corpus: str | Path
    maps: str | Path
    states_roots: Sequence[Path]
    cache: Path
    pool_corpus: str | Path | None = None


def run_paper(
    adapter: Seq2SeqAdapter,
    data: PaperData,
    settings: PaperSettings,
    parts: Sequence[str] = PARTS,
    model_path: str | Path | None = None,
    device: str = "cpu",
    note: Note = _quiet,
) -> PaperResult:
    """Every part of ``parts``: Tables 2-5 from decoding runs, Figures 2-4 from re-clustered states, from
    ``data`` (:class:`PaperData`); a direction without stored states is dumped with the model at
    ``model_path`` on ``device``.
    """
    corpus, maps, cache, pool_corpus = data.corpus, data.maps, data.cache, data.pool_corpus
    states_roots = data.states_roots
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ValueError(f"unknown parts {bad}; valid: {', '.join(PARTS)}")
    roots = [*states_roots, cache]
    if any(p.startswith("figure") for p in parts):
        # Refuse before the tables run (minutes to hours) rather than when Figure 2 needs the text.
        wanted = [settings.fig_direction, *(settings.fig2_pool if "figure2" in parts else ())]
        missing = [
            d
            for d in wanted
            if find_states(roots, d, adapter.fingerprint, settings.max_k) is None
            and not has_sources(pool_corpus or corpus, d, settings.dump_split)
        ]
        if missing:
            raise ValueError(
                f"no stored states and no source text for {', '.join(missing)} in {pool_corpus or corpus}: "
                "build a corpus with those languages (e.g. `fastvocab corpus --output DIR "
                "--languages en,fr,es`) and pass it as --pool-corpus DIR"
            )
    res = PaperResult()
    t0 = time.perf_counter()
    if any(p in TABLE_PARTS for p in parts):
        res.bench_rows = run_tables(adapter, corpus, maps, settings, parts, note)
        for name in TABLE_PARTS:
            if name in parts:
                res.tables[name] = TABLES[name](res.bench_rows, settings)
                res.spans[name] = span(table_sources(name, res.bench_rows, settings))
        res.seconds["tables"] = round(time.perf_counter() - t0, 1)
    if not any(p.startswith("figure") for p in parts):
        return res
    ref = ModelRef(
        str(Path(model_path or ".").resolve()), adapter.fingerprint, adapter.d_model, adapter.n_vocab
    )

    def states_of(direction: str, max_sentences: int) -> States:
        files = find_states(roots, direction, adapter.fingerprint, settings.max_k)
        origin = "stored"
        if files is None:
            if model_path is None:
                raise ValueError(f"no stored states for {direction} and no model path to dump them with")
            note(
                f"no stored states for {direction}: "
                f"dumping {max_sentences or settings.fig2_sentences} sentences"
            )
            files = dump_direction(
                ref,
                device,
                pool_corpus or corpus,
                direction,
                max_sentences or settings.fig2_sentences,
                cache,
                settings,
                note,
            )
            origin = "dumped"
        st = load_states(files, max_sentences)
        entry = res.states.setdefault(
            direction, {"folder": str(files[0].parent), "origin": origin, "uses": []}
        )
        entry["uses"].append({"sentences": st.sentences, "states": len(st.hidden)})  # type: ignore[union-attr]
        if max_sentences and st.sentences < max_sentences:
            note(f"{direction}: {st.sentences} sentences stored, fewer than the {max_sentences} asked for")
        return st

    if "figure2" in parts:
        t1, started = time.perf_counter(), time.time()
        own = states_of(settings.fig_direction, settings.fig2_sentences)
        others = [states_of(d, settings.fig2_sentences) for d in settings.fig2_pool]
        pooled = States.concat([own, *others], "+".join([settings.fig_direction, *settings.fig2_pool]))
        res.fig2 = figure2(own, pooled, settings, adapter.n_vocab, note)
        res.seconds["figure2"] = round(time.perf_counter() - t1, 1)
        res.spans["figure2"] = (started, time.time())
    if "figure3" in parts or "figure4" in parts:
        t1, started = time.perf_counter(), time.time()
        st = states_of(settings.fig_direction, settings.fig_state_sentences)
        if "figure3" in parts:
            res.fig3, res.fig4 = figure3_and_4(adapter, corpus, st, settings, note)
        else:  # Figure 4 alone: its r only, no decoding
            counters = active_counters(
                st, kmeans(st, settings.fig4_r, settings), settings.ks, adapter.n_vocab
            )
            res.fig4 = {k: set_fractions(c) for k, c in counters.items()}
        res.seconds["figure3_4"] = round(time.perf_counter() - t1, 1)
        ended = time.time()
        for name in ("figure3", "figure4"):  # one k-means per r serves both: they share the work's span
            if name in parts:
                res.spans[name] = (started, ended)
    return res


# ------------------------------------------------------------------------------------------------ writing


def figure4_rows(fractions: dict[int, np.ndarray]) -> list[dict[str, Any]]:
    """One row per centroid index, a column per K (percent)."""
    ks = sorted(fractions)
    n = len(fractions[ks[0]]) if ks else 0
    return [
        {"centroid": j, **{f"k{k}_pct": round(100.0 * float(fractions[k][j]), 4) for k in ks}}
        for j in range(n)
    ]


def write_table(rows: Sequence[dict[str, Any]], stem: Path, title: str = "") -> tuple[Path, Path]:
    """``<stem>.csv`` and ``<stem>.md`` (a pipe table under ``title``); columns: the union of the rows'
    keys."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    csv_path, md_path = stem.with_suffix(".csv"), stem.with_suffix(".md")
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows([{k: _cell(r.get(k)) for k in columns} for r in rows])

    def md(v: object) -> str:
        return _cell(v).replace("|", "\\|") or "-"

    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(md(r.get(k)) for k in columns) + " |" for r in rows]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:g}"
    return str(v)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, ax, path: Path, title: str) -> Path:
    """Grid, legend and title on ``ax``; ``fig`` written to ``path`` (PNG) and closed."""
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_figure2(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Maximum active percentage against the number of clusters, one line per way of building the maps."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for scope in dict.fromkeys(str(r["scope"]) for r in rows):
        sub = sorted((r for r in rows if r["scope"] == scope), key=lambda r: r["r"])
        ax.plot([r["r"] for r in sub], [r["max_active_pct"] for r in sub], marker="o", label=scope)
    ax.set_xlabel("number of clusters r")
    ax.set_ylabel("max active columns (% of vocabulary)")
    return _finish(plt, fig, ax, path, title)


def plot_figure3(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Speed percentage (tokens/s over full softmax's, minus 1) against r, one line per K."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for k in sorted({int(r["k"]) for r in rows}):  # type: ignore[arg-type]
        sub = sorted((r for r in rows if r["k"] == k), key=lambda r: r["r"])
        ax.plot([r["r"] for r in sub], [r["speed_pct"] for r in sub], marker="o", label=f"K={k}")
    ax.axhline(0.0, color="grey", linewidth=0.6)
    ax.set_xlabel("number of centroids r")
    ax.set_ylabel("speed vs full softmax (tokens/s, %)")
    return _finish(plt, fig, ax, path, title)

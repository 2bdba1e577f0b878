"""How much text a clustered map needs, and at which (K, probes, r), measured without decoding every setting.

For greedy decoding the clustered projection's output differs from full softmax's exactly when the full
model's greedy path has a step whose best token is outside the columns that step computes (before the first
such step both decode the same tokens; at it the clustered search cannot pick the best token). With union
selection a step computes at least its own row's probed sets, so a *miss* (the best token outside the sets of
the row's ``probes`` nearest clusters) bounds the differing sentences from above, and is exact with per-row
selection; the other rows of a batch can only add columns. So one full-softmax greedy pass over the test
split, plus the dumped states' clusters and top-K ids, gives every setting's greedy fidelity:

- ``sentence_differ``: the share of sentences with a miss on their path;
- ``step_miss``: the share of steps that miss;
- ``row_cols``: columns a row computes (the union of its probed sets), as a share of N;
- ``union_batch``: the union of the rows of a batch of ``batch`` consecutive test sentences at each step, as
  a share of N (what a union step computes), averaged over rows.

The dump's sentences enter in their order (the sources file's rows: nested prefixes), so a table over
``sentences`` is the data-scale curve for sets built from that much text; the centroids are trained once per
r on a sample of all stored states. Plain functions: no Ray, no MLflow.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fastvocab.artifacts_schema.hidden_states import fixed_list_to_numpy, iter_batches, read_shard_meta
from fastvocab.kernels import cluster_assign
from fastvocab.kernels.id_sets import unique_ids
from fastvocab.tasks.dump import DumpDecoder
from fastvocab.tasks.kmeans import sample_states, train_kmeans
from fastvocab.tasks.maps import assign, centroid_sq_norms

BATCH_ROWS = 65_536  # stored states read (and assigned) at a time


@dataclass(frozen=True)
class GreedyPath:
    """Full softmax's greedy path over some sentences: every step's state and its best token."""

    hidden: torch.Tensor  # (steps, d) float32
    best: torch.Tensor  # (steps,) int64
    sentence: torch.Tensor  # (steps,) int64: index of the sentence in the input list
    sentences: int


def greedy_path(
    decoder: DumpDecoder, sources: Sequence[str], src: str, tgt: str, batch: int = 32
) -> GreedyPath:
    """Decode ``sources`` greedily with full softmax (``decoder``'s model and projection), keeping each
    step's state in float32: the dump stores float16, whose rounding can move a state across a near-tie
    between two centroids, and the decoder assigns the float32 state."""
    from fastvocab.decoding.search import decode
    from fastvocab.decoding.settings import SearchSettings

    adapter, search = decoder.adapter, SearchSettings(max_len=decoder.max_len)
    hidden: list[torch.Tensor] = []
    best: list[torch.Tensor] = []
    sentence: list[torch.Tensor] = []
    for lo in range(0, len(sources), batch):

        def hook(r, lo: int = lo) -> None:
            hidden.append(r.hidden.float().cpu())
            best.append(r.output.to_vocab_ids(r.output.logits.argmax(1, keepdim=True))[:, 0].cpu())
            sentence.append(r.row_ids.cpu() + lo)

        texts = list(sources[lo : lo + batch])
        enc = adapter.encode_texts(texts, src, tgt)
        decode(adapter, decoder.projection, enc, src, tgt, search, step_hook=hook)
    if not hidden:
        return GreedyPath(torch.zeros((0, decoder.d)), torch.zeros(0, dtype=torch.long), torch.zeros(0), 0)
    h, b, s = torch.cat(hidden), torch.cat(best).long(), torch.cat(sentence).long()
    order = torch.argsort(s * (decoder.max_len + 1) + _steps_in_call_order(s), stable=True)
    return GreedyPath(h[order], b[order], s[order], len(sources))


def _steps_in_call_order(sentence: torch.Tensor) -> torch.Tensor:
    """The step of each row recorded in call order (a sentence's rows come one a step, in order)."""
    steps: list[int] = []
    seen: dict[int, int] = {}
    for x in sentence.tolist():
        steps.append(seen.get(x, 0))
        seen[x] = steps[-1] + 1
    return torch.tensor(steps, dtype=torch.long)


@dataclass
class DumpLabels:
    """What the sets need of the stored states: each state's sentence (its row in the sources file, so
    ``sentence < n`` is the first n dumped sentences) and top-K ids; hidden states are read per r."""

    files: list[Path]
    sentence: np.ndarray  # (states,) int64
    topk: np.ndarray  # (states, K) int32
    d: int

    @property
    def states(self) -> int:
        return len(self.sentence)

    @property
    def dumped_sentences(self) -> int:
        return int(self.sentence.max()) + 1 if len(self.sentence) else 0


def load_labels(files: Sequence[Path], k: int) -> DumpLabels:
    """The sentence and top-``k`` ids of every stored state of ``files`` (streamed; no hidden state kept)."""
    files = list(files)
    meta = read_shard_meta(files[0])
    if k > meta.k:
        raise ValueError(f"K={k} exceeds the K={meta.k} the dump recorded")
    sent, top = [], []
    for batch in iter_batches(files, columns=["sent_id", "topk_ids"], batch_size=BATCH_ROWS):
        sent.append(batch.column("sent_id").to_numpy())
        top.append(fixed_list_to_numpy(batch.column("topk_ids"), meta.k, np.int32)[:, :k])
    return DumpLabels(files, np.concatenate(sent), np.concatenate(top), meta.d)


def train_centroids(files: Sequence[Path], r: int, seed: int = 1234, sample: int | None = None) -> np.ndarray:
    """Faiss k-means with ``r`` centroids on a seeded sample of the stored states (``r x 256`` by
    default, what the pipeline's k-means trains on)."""
    x, _ = sample_states(files, sample or r * 256, seed)
    centroids, _ = train_kmeans(x, r, seed=seed)
    return centroids


def assign_stored(labels: DumpLabels, centroids: np.ndarray) -> np.ndarray:
    """The nearest centroid of every stored state, (states,) int64, as the maps stage assigns them."""
    norms = centroid_sq_norms(centroids)
    out = []
    for batch in iter_batches(labels.files, columns=["hidden"], batch_size=BATCH_ROWS):
        out.append(
            assign(fixed_list_to_numpy(batch.column("hidden"), labels.d, np.float32), centroids, norms)
        )
    return np.concatenate(out)


def set_masks(
    clusters: np.ndarray,
    topk: np.ndarray,
    sentence: np.ndarray,
    r: int,
    n_vocab: int,
    sizes: Sequence[int],
    always_active: Sequence[int] = (),
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(n, mask)`` for each n of ``sizes`` (ascending): the (r, N) bool sets built from the states of the
    first n sentences, plus ``always_active`` (the ids every set gets at decode time: EOS, the language
    tags); nested: each mask grows from the last one (yielded masks are views, copy to keep)."""
    order = np.argsort(sentence, kind="stable")
    sent_sorted = sentence[order]
    mask = torch.zeros((r, n_vocab), dtype=torch.bool)
    mask[:, list(always_active)] = True
    done = 0
    for n in sizes:
        upto = int(np.searchsorted(sent_sorted, n, side="left"))
        rows = order[done:upto]
        if len(rows):
            cl = torch.from_numpy(np.repeat(clusters[rows], topk.shape[1]))
            ids = torch.from_numpy(topk[rows].reshape(-1).astype(np.int64))
            mask[cl, ids] = True
        done = upto
        yield n, mask


def step_misses(
    mask: torch.Tensor,
    near: torch.Tensor,
    path: GreedyPath,
    probes: int,
    extra: torch.Tensor | None = None,
) -> torch.Tensor:
    """(steps,) bool: the step's best token is outside the sets of its ``probes`` nearest clusters (and
    outside its sentence's row of ``extra``, (sentences, N) bool: per-sentence candidates such as a
    shortlist's; ``probes`` 0 with ``extra``: the candidates alone)."""
    hit = torch.zeros(len(path.best), dtype=torch.bool)
    for j in range(probes):
        hit |= mask[near[:, j], path.best]
    if extra is not None:
        hit |= extra[path.sentence, path.best]
    return ~hit


# popcount of every byte: set sizes of bit-packed masks
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
# batch-steps whose union is measured per point (evenly spaced): the mean over a few hundred is within a
# fraction of a percent of the mean over all, and each costs a few probed sets' OR
UNION_GROUPS = 600


def path_coverage(
    mask: torch.Tensor,
    near: torch.Tensor,
    path: GreedyPath,
    probes: int,
    batch: int = 32,
    extra: torch.Tensor | None = None,
) -> dict[str, float]:
    """Greedy fidelity of the sets ``mask`` (r, N) on ``path`` with ``probes`` nearest clusters (``near``:
    the path's (steps, >= probes) nearest clusters, nearest first), and with ``extra`` (sentences, N) bool,
    each sentence's candidates that every step of its batch computes (a shortlist's, bound to the batch:
    a row's columns hold its own sentence's, the union all of the batch's sentences')."""
    n_vocab = mask.shape[1]
    miss = step_misses(mask, near, path, probes, extra)
    differ = torch.unique(path.sentence[miss]).numel()
    packed = np.packbits(mask.numpy(), axis=1)  # (r, N / 8): the sets as bits
    cand = None if extra is None else np.packbits(extra.numpy(), axis=1)  # (sentences, N / 8)
    cl = near[:, :probes].numpy()
    sent = path.sentence.numpy()
    # columns per row: the union of a row's probed sets (and its sentence's candidates)
    row_cols = 0
    for lo in range(0, len(sent), 4096):
        bits = np.zeros((len(sent[lo : lo + 4096]), packed.shape[1]), dtype=np.uint8)
        if probes:
            bits |= np.bitwise_or.reduce(packed[cl[lo : lo + 4096]], axis=1)  # (rows, N / 8)
        if cand is not None:
            bits |= cand[sent[lo : lo + 4096]]
        row_cols += int(_POPCOUNT[bits].sum())
    # the union a batch computes at each step: the rows of ``batch`` consecutive sentences at that step,
    # averaged over rows (each row of the step pays for the whole union)
    groups = _batch_steps(path, batch)
    pick = groups[:: max(1, len(groups) // UNION_GROUPS)]

    def union(g: np.ndarray) -> int:
        bits = np.zeros(packed.shape[1], dtype=np.uint8)
        if probes:
            bits |= np.bitwise_or.reduce(packed[unique_ids(cl[g])], 0)
        if cand is not None:
            first = sent[g[0]] // batch * batch  # the batch's sentences, bound for all its steps
            bits |= np.bitwise_or.reduce(cand[first : first + batch], 0)
        return int(_POPCOUNT[bits].sum())

    union_cols = sum(len(g) * union(g) for g in pick)
    weight = sum(len(g) for g in pick)
    steps = max(len(cl), 1)
    return {
        "step_miss": float(miss.float().mean()),
        "sentence_differ": differ / path.sentences,
        "row_cols": row_cols / steps / n_vocab,
        "union_batch": union_cols / max(weight, 1) / n_vocab,
    }


def _batch_steps(path: GreedyPath, batch: int) -> list[np.ndarray]:
    """The row indices of each (batch of ``batch`` consecutive sentences, step), in order."""
    key = (path.sentence // batch) * 10_000 + _steps(path.sentence)
    order = torch.argsort(key, stable=True).numpy()
    k = key.numpy()[order]
    cuts = np.flatnonzero(np.diff(k)) + 1
    return np.split(order, cuts) if len(order) else []


def _steps(sentence: torch.Tensor) -> torch.Tensor:
    """Each row's step within its sentence (rows of a sentence are consecutive, in step order)."""
    starts = torch.ones(len(sentence), dtype=torch.bool)
    starts[1:] = sentence[1:] != sentence[:-1]
    idx = torch.arange(len(sentence))
    first = torch.cummax(torch.where(starts, idx, torch.zeros_like(idx)), 0).values
    return idx - first


def nearest(path: GreedyPath, centroids: np.ndarray, probes: int) -> torch.Tensor:
    """The path's ``probes`` nearest clusters per step, nearest first (the decoder's own rule)."""
    c = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    return cluster_assign.nearest_clusters(path.hidden, c.T.contiguous(), (c * c).sum(1), probes)


def doubling_sizes(total: int, first: int = 1500) -> list[int]:
    """``first``, then doubling, then ``total``: the curve's data sizes."""
    sizes, n = [], first
    while n < total:
        sizes.append(n)
        n *= 2
    return [*sizes, total]


@dataclass(frozen=True)
class CoverageGrid:
    """The points measured: every r (clusters), K (top-K ids a state adds to its set) and probes (nearest
    clusters a row reads); ``batch``: the consecutive sentences whose union a step computes; ``seed``: the
    k-means seed of centroids trained here."""

    rs: Sequence[int]
    ks: Sequence[int]
    probes: Sequence[int]
    batch: int = 32
    seed: int = 1234


def coverage_curve(
    labels: DumpLabels,
    path: GreedyPath | dict[str, GreedyPath],
    n_vocab: int,
    grid: CoverageGrid,
    *,
    sizes: Sequence[int],
    centroids: dict[int, np.ndarray] | None = None,
    always_active: Sequence[int] = (),
) -> list[dict[str, float | int]]:
    """Every (r, sentences, K, probes) point of ``grid``'s greedy fidelity and columns
    (:func:`path_coverage`), on one path or on several named ones (rows then carry ``split``: the states are
    assigned once for all); ``sizes``: the dumped sentences the sets are built from; ``centroids``: by r,
    else trained here; ``always_active``: the model's ids every set gets at decode time
    (``adapter.always_active_ids()``)."""
    rs, ks, probes, batch, seed = grid.rs, grid.ks, grid.probes, grid.batch, grid.seed
    paths = path if isinstance(path, dict) else {"": path}
    rows: list[dict[str, float | int]] = []
    for r in rs:
        c = centroids[r] if centroids and r in centroids else train_centroids(labels.files, r, seed)
        clusters = assign_stored(labels, c)
        near = {name: nearest(p, c, max(probes)) for name, p in paths.items()}
        for k in ks:
            masks = set_masks(clusters, labels.topk[:, :k], labels.sentence, r, n_vocab, sizes, always_active)
            for n, mask in masks:
                set_frac = float(mask.sum()) / r / n_vocab
                for name, p_ in paths.items():
                    for p in probes:
                        point = path_coverage(mask, near[name], p_, p, batch)
                        row: dict = {"r": r, "sentences": n, "K": k, "probes": p, "set_frac": set_frac}
                        if name:
                            row["split"] = name
                        rows.append({**row, **point})
    return rows


def misses_per_doubling(rows: Sequence[dict], r: int, k: int, probes: int) -> float | None:
    """How the differing share shrinks per doubling of the text at one setting: the mean of
    ``differ(2n) / differ(n)`` over the curve's doubling steps (None with fewer than two points)."""
    pts = sorted(
        (int(x["sentences"]), float(x["sentence_differ"]))
        for x in rows
        if (x["r"], x["K"], x["probes"]) == (r, k, probes)
    )
    ratios = [
        (b / a) ** (1 / math.log2(n2 / n1))
        for (n1, a), (n2, b) in itertools.pairwise(pts)
        if a > 0 and b > 0 and n2 > n1
    ]
    return float(np.exp(np.mean(np.log(ratios)))) if ratios else None


def sentences_for(rows: Sequence[dict], r: int, k: int, probes: int, budget: float) -> int | None:
    """The dumped sentences this setting needs for ``sentence_differ <= budget``, extrapolated from its last
    point by the curve's rate per doubling (None when the curve does not fall)."""
    pts = sorted(
        (int(x["sentences"]), float(x["sentence_differ"]))
        for x in rows
        if (x["r"], x["K"], x["probes"]) == (r, k, probes)
    )
    if not pts:
        return None
    n, differ = pts[-1]
    if differ <= budget:
        return n
    rate = misses_per_doubling(rows, r, k, probes)
    if rate is None or rate >= 1:
        return None
    return math.ceil(n * 2 ** (math.log(budget / differ) / math.log(rate)))


def choose(rows: Sequence[dict], budget: float, sentences: int) -> dict | None:
    """The cheapest point built from ``sentences`` whose predicted differing share is within ``budget``:
    fewest columns a union batch computes, then fewest a row computes (None when no point is)."""
    ok = [r for r in rows if r["sentences"] == sentences and r["sentence_differ"] <= budget]
    return min(ok, key=lambda r: (r["union_batch"], r["row_cols"]), default=None)


def tune_by_coverage(
    decoder: DumpDecoder,
    files: Sequence[Path],
    dev: Sequence[str],
    test: Sequence[str],
    direction: str,
    grid: CoverageGrid,
    *,
    budget: float,
    first: int = 1500,
) -> dict:
    """``fastvocab tune --by coverage``: every (r, K, probes) point of ``grid``'s predicted greedy
    differences on ``dev`` (and the data-scale curve), the cheapest point within ``budget``, its prediction
    on ``test``, and, for every point not within it, how many dumped sentences its curve says it needs."""
    rs, ks, probes, batch, seed = grid.rs, grid.ks, grid.probes, grid.batch, grid.seed
    src, _, tgt = direction.partition("-")
    dev_path = greedy_path(decoder, dev, src, tgt)
    labels = load_labels(files, max(ks))
    sizes = doubling_sizes(labels.dumped_sentences, first)
    centroids = {r: train_centroids(labels.files, r, seed) for r in rs}
    aa = decoder.adapter.always_active_ids()
    rows = coverage_curve(
        labels, dev_path, decoder.n_vocab, grid, sizes=sizes, centroids=centroids, always_active=aa
    )
    full = labels.dumped_sentences
    chosen = choose(rows, budget, full)
    need = {
        f"r={r} K={k} probes={p}": sentences_for(rows, r, k, p, budget)
        for r in rs
        for k in ks
        for p in probes
    }
    result: dict = {
        "dumped_sentences": full,
        "stored_states": labels.states,
        "sizes": sizes,
        "rows": rows,
        "chosen": chosen,
        "sentences_needed": need,
        "test": None,
    }
    if chosen is not None:
        result["halving"] = misses_per_doubling(rows, chosen["r"], chosen["K"], chosen["probes"])
        test_path = greedy_path(decoder, test, src, tgt)
        r, k, p = chosen["r"], chosen["K"], chosen["probes"]
        clusters = assign_stored(labels, centroids[r])
        ((_, mask),) = set_masks(
            clusters, labels.topk[:, :k], labels.sentence, r, decoder.n_vocab, [full], aa
        )
        result["test"] = {
            "sentences": test_path.sentences,
            **path_coverage(mask, nearest(test_path, centroids[r], p), test_path, p, batch),
        }
    return result

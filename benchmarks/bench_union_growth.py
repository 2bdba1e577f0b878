"""How a batch's union of cluster sets grows in real maps with 2-20% of N per set, against synthetic maps.

``bench_model_scale.py`` times clustered decoding at model scale over synthetic maps: r sets of
``frac x N`` ids drawn by Zipf-like popularity (``--zipf``). What it measures depends on how the union of a
batch's sets grows, and the real maps ``make demo`` builds keep about 0.05% of N per cluster, far below the
2-20% operating points. This script builds real maps of the demo model at those fractions and measures
their growth in the same terms, so the synthetic maps' ``--zipf`` can be chosen from a measurement.

**Real sets at a chosen fraction.** From the hidden states a run dumped (``<run>/states``, greedy and beam
states of one direction), every state's logits ``W h + b`` are computed with the model's own projection and
its top-``kmax`` ids kept, best first. Faiss k-means (``tasks.kmeans.train_kmeans``) clusters the states into
r clusters; a cluster's set at top-K is the union of its members' top-K ids (``tasks.maps.build_active_sets``,
the sets the pipeline builds, with K far above the pipeline's 8). For each asked fraction, K is the smallest
value whose mean set size reaches ``frac x N``.

**Growth, two ways.**

- ``random``: the mean union fraction of 1 / 8 / 32 / 128 clusters drawn with replacement (real sets: in
  proportion to their member counts, as ``bench_model_scale.py`` reads the demo map; synthetic: uniformly,
  as it reads the synthetic maps).
- ``batches``: the union fraction of the clusters of the rows of real decoding batches: the dump's states
  grouped by consecutive blocks of ``batch`` sentences and step (greedy batch 8 and 32, beam 4 batch 8 with
  its 4 hypotheses a sentence), averaged over rows, so long batches count as they cost. The synthetic sets
  are read through the same cluster ids (cluster j gets synthetic set j), which isolates how the sets
  overlap from how decoding states spread over clusters.

Writes ``benchmarks/results/union-growth-<date>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from bench_meta import cpu_name
from bench_model_scale import set_union_growth, synthetic_sets

from fastvocab.artifacts_schema.provenance import git_commit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
POINTS = (("greedy", 1, 8), ("greedy", 1, 32), ("beam 4", 4, 8))  # (name, beam, batch)


def load_states(states_root: Path, direction: str, beam: int) -> dict[str, np.ndarray]:
    """sent_id, step and hidden (float32) of every state dumped for ``direction`` at ``beam``."""
    from fastvocab.artifacts_schema.hidden_states import (
        beam_root,
        direction_dir,
        fixed_list_to_numpy,
        iter_batches,
        read_shard_meta,
    )

    files = sorted(direction_dir(beam_root(states_root, beam), direction).glob("part-*.parquet"))
    if not files:
        raise SystemExit(f"bench_union_growth: no beam-{beam} states for {direction} under {states_root}")
    d = read_shard_meta(files[0]).d
    parts: dict[str, list[np.ndarray]] = {"sent_id": [], "step": [], "hidden": []}
    for batch in iter_batches(files, columns=["sent_id", "step", "hidden"]):
        parts["sent_id"].append(batch.column("sent_id").to_numpy())
        parts["step"].append(batch.column("step").to_numpy())
        parts["hidden"].append(fixed_list_to_numpy(batch.column("hidden"), d, np.float32))
    return {k: np.concatenate(v) for k, v in parts.items()}


def top_ids(weight: torch.Tensor, bias: torch.Tensor | None, hidden: np.ndarray, kmax: int) -> np.ndarray:
    """Each state's ``kmax`` highest-scoring ids under ``W h + b``, best first: (n, kmax) int32."""
    out = np.empty((len(hidden), kmax), dtype=np.int32)
    with torch.inference_mode():
        for lo in range(0, len(hidden), 4096):
            logits = torch.nn.functional.linear(torch.from_numpy(hidden[lo : lo + 4096]), weight, bias)
            out[lo : lo + len(logits)] = logits.topk(kmax, dim=1).indices.numpy()
    return out


def first_ranks(cluster_ids: np.ndarray, top: np.ndarray, r: int, n: int) -> np.ndarray:
    """(r, n) int32: the best rank at which any member of cluster c has id t in its top list (kmax if none).

    A cluster's set at top-K is then ``first_ranks[c] < K``: the union of its members' top-K ids, the set
    ``tasks.maps.build_active_sets`` builds from the first K columns, for every K at once.
    """
    kmax = top.shape[1]
    ranks = np.full((r, n), kmax, dtype=np.int32)
    flat = ranks.reshape(-1)
    base = cluster_ids.astype(np.int64) * n
    for j in range(kmax):  # ranks only grow with j, so the first write of a pair is its best rank
        keys = base + top[:, j]
        fresh = flat[keys] == kmax
        flat[keys[fresh]] = j
    return ranks


def sets_at_fraction(ranks: np.ndarray, frac: float) -> tuple[int, np.ndarray, np.ndarray]:
    """(K, indptr, indices): the smallest K whose mean set size reaches ``frac x N``."""
    r, n = ranks.shape
    kmax = int(ranks.max())
    mean_size = np.cumsum(np.bincount(ranks.reshape(-1), minlength=kmax + 1)[:kmax]) / r  # at K = 1..kmax
    reach = np.flatnonzero(mean_size >= frac * n)
    if len(reach) == 0:
        raise SystemExit(f"bench_union_growth: top-{kmax} sets stay below {frac:g} of N; raise --kmax")
    k = int(reach[0]) + 1
    active = ranks < k
    indptr = np.r_[0, np.cumsum(active.sum(1))].astype(np.int64)
    return k, indptr, np.nonzero(active)[1].astype(np.int32)


def batch_union(
    cluster_ids: np.ndarray, sent_id: np.ndarray, step: np.ndarray, batch: int, indptr, indices, n: int
) -> dict[str, float]:
    """Row-weighted mean union fraction (and mean distinct clusters) of real decoding batches' rows."""
    key = (sent_id // batch) * (int(step.max()) + 1) + step
    order = np.lexsort((cluster_ids, key))
    key, cl = key[order], cluster_ids[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], len(key)]
    union_rows, distinct_rows, rows = 0.0, 0.0, 0
    mask = np.zeros(n, dtype=bool)
    for a, b in zip(starts, ends, strict=True):
        clusters = np.unique(cl[a:b])
        mask[:] = False
        for c in clusters:
            mask[indices[indptr[c] : indptr[c + 1]]] = True
        union_rows += mask.mean() * (b - a)
        distinct_rows += len(clusters) * (b - a)
        rows += b - a
    return {
        "union_fraction": round(union_rows / rows, 5),
        "distinct_clusters": round(distinct_rows / rows, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "demo"), help="the model folder the run used")
    p.add_argument("--states", default=str(ROOT / "runs" / "demo" / "states"), help="a run's states folder")
    p.add_argument("--direction", default="en-it")
    p.add_argument("--clusters", default="1000,2000", help="r values (comma-separated)")
    p.add_argument("--active", default="0.02,0.05,0.1,0.2", help="set fractions of N (comma-separated)")
    p.add_argument("--zipf", default="1,1.5,2,3", help="synthetic exponents to compare (comma-separated)")
    p.add_argument("--kmax", type=int, default=8192, help="top ids kept per state (the largest K tried)")
    p.add_argument("--out", default=None, help="result JSON (default: results/union-growth-<date>.json)")
    args = p.parse_args(argv)
    rs = [int(x) for x in args.clusters.split(",")]
    fracs = [float(x) for x in args.active.split(",")]
    zipfs = [float(x) for x in args.zipf.split(",")]

    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.tasks.kmeans import train_kmeans
    from fastvocab.tasks.maps import assign

    t0 = time.perf_counter()
    adapter = Seq2SeqAdapter.load(args.model)
    n = adapter.n_vocab
    states = {beam: load_states(Path(args.states), args.direction, beam) for beam in (1, 4)}
    hidden = np.concatenate([s["hidden"] for s in states.values()])
    kmax = min(args.kmax, n)
    print(f"bench_union_growth: {len(hidden)} states, N {n}; top-{kmax} ids ...", file=sys.stderr)
    top = top_ids(adapter.output_weight.float(), adapter.output_bias, hidden, kmax)
    split = len(states[1]["hidden"])

    rows = []
    for r in rs:
        centroids, _ = train_kmeans(hidden, r, niter=20, seed=1234, max_points_per_centroid=256)
        cluster_ids = assign(hidden, centroids)
        by_beam = {1: cluster_ids[:split], 4: cluster_ids[split:]}
        members = np.bincount(cluster_ids, minlength=r)
        ranks = first_ranks(cluster_ids, top, r, n)
        for frac in fracs:
            k, indptr, indices = sets_at_fraction(ranks, frac)
            sizes = np.diff(indptr)
            entry = {
                "r": r,
                "active_fraction": frac,
                "k": k,
                "set_fraction": {
                    "mean": round(float(sizes.mean() / n), 5),
                    "p10": round(float(np.percentile(sizes, 10) / n), 5),
                    "p90": round(float(np.percentile(sizes, 90) / n), 5),
                },
                "real": {"random": set_union_growth(indptr, indices, n, weights=members * (sizes > 0))},
                "synthetic": {},
            }
            synthetic = {z: synthetic_sets(n, r, frac, z) for z in zipfs}
            for z, (sp, si) in synthetic.items():
                entry["synthetic"][f"{z:g}"] = {"random": set_union_growth(sp, si, n)}
            for name, beam, batch in POINTS:
                label = f"{name} batch {batch}"
                s = states[beam]
                real = batch_union(by_beam[beam], s["sent_id"], s["step"], batch, indptr, indices, n)
                entry["real"][label] = real
                for z, (sp, si) in synthetic.items():
                    entry["synthetic"][f"{z:g}"][label] = batch_union(
                        by_beam[beam], s["sent_id"], s["step"], batch, sp, si, n
                    )["union_fraction"]
            rows.append(entry)
            print(
                f"r {r} frac {frac:g}: K {k}, greedy batch 32 real "
                f"{entry['real']['greedy batch 32']['union_fraction']:.3f}, synthetic "
                + ", ".join(f"z{z}: {v['greedy batch 32']:.3f}" for z, v in entry["synthetic"].items()),
                file=sys.stderr,
            )

    result = {
        "meta": {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit(cwd=ROOT),
            "cpu": cpu_name(),
            "argv": sys.argv[1:] if argv is None else argv,
            "model": args.model,
            "n_vocab": n,
            "states": {str(b): len(s["hidden"]) for b, s in states.items()},
            "sentences": {str(b): len(np.unique(s["sent_id"])) for b, s in states.items()},
            "seconds": round(time.perf_counter() - t0, 1),
        },
        "rows": rows,
    }
    out = Path(args.out) if args.out else RESULTS / f"union-growth-{dt.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"bench_union_growth: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

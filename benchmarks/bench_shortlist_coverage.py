"""Greedy fidelity of the lexical shortlist, of clustered sets, and of both together, without decoding.

Reads a pipeline work dir that stored every state it dumped (``configs/demo-maps.yaml``) and its k-means
centroids, and a shortlist table per direction built with the largest k and frequent list of the grid
(``--shortlist``: a table folder's parent laid out as ``<DIR>/shortlist/<src>-<tgt>``; the points use the
first ``k`` entries of each row and the first ``frequent`` ids, as the projection's options do). Decodes the
dev and test splits greedily with full softmax and measures each point with ``experiments.coverage``: a step
*misses* when its best token is outside the columns its row is sure to compute, and a sentence with a miss is
one whose greedy output changes (exact for the shortlist, whose rows pick only from their own sentence's
candidates, and for one sentence a batch; with union selection the other rows can only add columns):

- ``shortlist``: the sentence's candidates (rows of its source subwords, the frequent list, the always-active
  ids and the unknown token, and with ``copy`` the source subwords themselves) over k x frequent x copy x
  min_prob (``--min-prob``: the table's entries below it dropped; ``--shortlist-only``: these points alone);
- ``clustered``: the sets of the row's ``probes`` nearest clusters (K = each state's top-K ids), K x probes;
- ``both``: the union of the two, K x probes x k x frequent (copy on).

Per point: ``sentence_differ``, ``step_miss``, ``row_cols`` (columns a row computes, share of N) and
``union_batch`` (what a step of ``--batch`` consecutive sentences computes: the probed sets of its rows and
the candidates of all its sentences). Writes ``benchmarks/results/shortlist-coverage-<date>.json``
(``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import time
from pathlib import Path

import torch
from bench_meta import cpu_name, git_commit, write_result
from safetensors.numpy import load_file

from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.hidden_states import validate_beams
from fastvocab.artifacts_schema.kmeans_result import CENTROIDS_FILE
from fastvocab.experiments import coverage
from fastvocab.tasks.context import RunContext, describe_model
from fastvocab.tasks.dump import DumpDecoder, DumpSettings
from fastvocab.tasks.projections import make_projection

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def candidate_masks(
    adapter,
    table: Path,
    sources: list[str],
    src: str,
    tgt: str,
    k: int,
    frequent: int,
    copy: bool,
    min_prob: float = 0.0,
) -> torch.Tensor:
    """(sentences, N) bool: each sentence's shortlist candidates at (k, frequent, copy, min_prob), as the
    projection bound to its batch computes them."""
    proj = make_projection(
        adapter, "shortlist", index=table, k=k, frequent=frequent, copy=copy, min_prob=min_prob
    )
    out = torch.zeros((len(sources), adapter.n_vocab), dtype=torch.bool)
    for i, ids in enumerate(adapter.tokenize(sources, src, tgt)):
        out[i, torch.from_numpy(proj.candidates(ids))] = True
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "demo-maps")
    p.add_argument("--shortlist", type=Path, required=True, help="root of the tables: <DIR>/shortlist/<dir>")
    p.add_argument("--model", type=Path, default=ROOT / "models" / "demo")
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--directions", default="en-it,it-en")
    p.add_argument("--splits", default="dev,test")
    p.add_argument("--k", type=_ints, default=[10, 20, 50, 100, 200], help="table entries a source subword")
    p.add_argument("--frequent", type=_ints, default=[0, 500, 2000, 4000, 8000])
    p.add_argument(
        "--min-prob", type=lambda t: [float(x) for x in t.split(",")], default=[0.0], help="shortlist cuts"
    )
    p.add_argument("--shortlist-only", action="store_true", help="no clustered sets (no states read)")
    p.add_argument("--ks", type=_ints, default=[1, 2, 3], help="the clusters' sets: each state's top-K ids")
    p.add_argument("--probes", type=_ints, default=[1, 2, 4, 8])
    p.add_argument("--both-k", type=_ints, default=[5, 10, 20, 50], help="shortlist k of the combination")
    p.add_argument("--both-frequent", type=_ints, default=[0, 100, 500])
    p.add_argument("--batch", type=int, default=32, help="sentences a batch for the union's columns")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = a.out or RESULTS / f"shortlist-coverage-cpu-{dt.date.today().isoformat()}.json"
    ref = describe_model(a.model)
    decoder = DumpDecoder(RunContext(ref, torch_threads=a.threads), DumpSettings(k=1, max_len=128))
    adapter = decoder.adapter
    aa = adapter.always_active_ids()
    record: dict = {
        "meta": {
            "what": "greedy fidelity (coverage of full softmax's greedy path) of the shortlist, the "
            "clustered sets and both",
            "device": cpu_name(),
            "model": str(a.model),
            "model_fingerprint": ref.fingerprint,
            "N": ref.n_vocab,
            "work_dir": str(a.work_dir),
            "batch": a.batch,
            "commit": git_commit(),
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": "python benchmarks/bench_shortlist_coverage.py "
            + " ".join(
                f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(a).items()
                if v is not None and k != "out"
            ),
        },
        "directions": {},
    }
    for direction in a.directions.split(","):
        src, _, tgt = direction.partition("-")
        t0 = time.perf_counter()
        table = a.shortlist / "shortlist" / direction
        sources = {s: read_direction(a.corpus, src, tgt, s)[1] for s in a.splits.split(",")}
        paths = {s: coverage.greedy_path(decoder, lines, src, tgt) for s, lines in sources.items()}
        centroids = load_file(str(a.work_dir / "kmeans" / direction / CENTROIDS_FILE))["centroids"]
        r = len(centroids)
        masks = {a.ks[0]: torch.zeros((r, ref.n_vocab), dtype=torch.bool)}  # unread by shortlist points
        states, dumped = 0, 0
        if not a.shortlist_only:
            by_beam = validate_beams(a.work_dir / "states", direction, fingerprint=ref.fingerprint)
            files = [f for fs in by_beam.values() for f in fs]
            labels = coverage.load_labels(files, max(a.ks))
            states, dumped = labels.states, labels.dumped_sentences
            clusters = coverage.assign_stored(labels, centroids)
            for k in a.ks:
                ((_, m),) = coverage.set_masks(
                    clusters, labels.topk[:, :k], labels.sentence, r, ref.n_vocab, [dumped], aa
                )
                masks[k] = m.clone()
        near = {s: coverage.nearest(pth, centroids, max(a.probes)) for s, pth in paths.items()}
        print(f"{direction}: paths, {states:,} states assigned in {time.perf_counter() - t0:.0f} s")
        rows: list[dict] = []
        for split, pth in paths.items():
            nr, lines = near[split], sources[split]
            for copy, k, f, mp in itertools.product((False, True), a.k, a.frequent, a.min_prob):
                cand = candidate_masks(adapter, table, lines, src, tgt, k, f, copy, mp)
                cov = coverage.path_coverage(masks[a.ks[0]], nr, pth, 0, a.batch, cand)
                at = {"k": k, "frequent": f, "copy": copy, "min_prob": mp}
                rows.append({"split": split, "method": "shortlist", **at, **cov})
            if a.shortlist_only:
                continue
            for k, pr in itertools.product(a.ks, a.probes):
                cov = coverage.path_coverage(masks[k], nr, pth, pr, a.batch)
                rows.append({"split": split, "method": "clustered", "K": k, "probes": pr, **cov})
            for k, f in itertools.product(a.both_k, a.both_frequent):
                cand = candidate_masks(adapter, table, lines, src, tgt, k, f, True)
                for kk, pr in itertools.product(a.ks, [x for x in a.probes if x <= 4]):
                    cov = coverage.path_coverage(masks[kk], nr, pth, pr, a.batch, cand)
                    at = {"K": kk, "probes": pr, "k": k, "frequent": f, "copy": True}
                    rows.append({"split": split, "method": "both", **at, **cov})
        record["directions"][direction] = {
            "stored_states": states,
            "dumped_sentences": dumped,
            "r": r,
            "table": str(table),
            "split_sentences": {k: v.sentences for k, v in paths.items()},
            "seconds": round(time.perf_counter() - t0, 1),
            "rows": rows,
        }
        print(f"{direction}: {len(rows)} points in {time.perf_counter() - t0:.0f} s", flush=True)
    write_result(out, record)


if __name__ == "__main__":
    main()

"""Dump throughput (states/s per worker) and Faiss k-means time (1M states x d=512, r=2000 by default).

Dump: one worker = one ``DumpDecoder`` with ``torch_threads`` threads (the pipeline's default on 2 cores is 1
thread per worker, 2 workers), decoding ``--sentences`` source sentences of the corpus in shards, after a
warm-up shard; states/s = recorded states / decode seconds (model load excluded), median of ``--repeats``.
Model: ``models/demo`` when present, else a random-weight model with the demo preset's shape built on the
fly (named in the result).

K-means: ``faiss.Kmeans`` on synthetic float32 states (a Gaussian mixture, so it has structure to find),
niter 20, fixed seed, ``max_points_per_centroid`` high enough that every state is used.

    .venv/bin/python benchmarks/bench_dump_kmeans.py   # -> benchmarks/results/dump-kmeans-cpu-<date>.json
    .venv/bin/python benchmarks/bench_dump_kmeans.py --quick   # small sizes, to check the script
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_meta import cpu_name

from fastvocab.artifacts_schema.provenance import git_commit

log = logging.getLogger("bench")
ROOT = Path(__file__).resolve().parents[1]


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def random_demo_like_model(out: Path) -> Path:
    """A random-weight M2M100 with the demo ``tiny`` preset's shape (when models/demo is absent)."""
    import torch
    from transformers import M2M100ForConditionalGeneration

    from fastvocab.training.demo_model import PRESETS, build_tokenizer, model_config, train_sentencepiece

    texts = [line for lang in ("en", "it") for line in source_sentences(lang, 3000)]
    arch = dict(PRESETS["tiny"])
    spm = train_sentencepiece(texts, arch["vocab"], out / "spm")
    tok = build_tokenizer(spm, ["en", "it"], out / "model")
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(model_config(arch, tok, max_positions=256)).eval()
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return out / "model"


def source_sentences(lang: str, n: int) -> list[str]:
    """Source side of the corpus (en-it pair) when present, else synthetic sentences."""
    from fastvocab.artifacts_schema.corpus import read_direction

    other = "it" if lang == "en" else "en"
    try:
        _, src, _ = read_direction(ROOT / "data" / "corpus", lang, other, "train", limit=n)
        if len(src) >= n:
            return src
    except Exception as exc:  # any reason (no corpus, too small): fall back to synthetic text
        log.info("corpus not usable (%s): synthetic sentences", exc)
    rng = np.random.default_rng(0)
    words = ["the", "a", "package", "for", "library", "tool", "data", "file", "system", "server", "network"]
    return [" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(n)]


def bench_dump(args) -> dict[str, object]:
    import torch

    from fastvocab.tasks.context import RunContext, describe_model
    from fastvocab.tasks.dump import DumpDecoder, DumpSettings, plan_shards

    model = ROOT / "models" / "demo"
    which = "models/demo"
    tmp = None
    if not (model / "config.json").exists():
        tmp = tempfile.TemporaryDirectory()
        model = random_demo_like_model(Path(tmp.name))
        which = "random-weight M2M100, demo 'tiny' preset shape (models/demo absent)"
    ctx = RunContext(describe_model(model), torch_threads=args.threads)
    decoder = DumpDecoder(ctx, DumpSettings(k=args.k, max_len=args.max_len, batch_size=args.batch_size))
    texts = source_sentences("en", args.sentences + args.shard)
    warm, *_ = plan_shards("en-it", list(range(args.shard)), texts[: args.shard], args.shard)
    decoder.decode_shard(warm)
    specs = plan_shards("en-it", list(range(args.sentences)), texts[args.shard :], args.shard)
    runs = []
    for _ in range(args.repeats):
        states, seconds = 0, 0.0
        for spec in specs:
            t0 = time.perf_counter()
            cols = decoder.decode_shard(spec)
            seconds += time.perf_counter() - t0
            states += len(cols["sent_id"])
        runs.append({"states": states, "seconds": seconds, "states_per_s": states / seconds})
    rate = statistics.median(r["states_per_s"] for r in runs)
    result = {
        "model": which,
        "n_vocab": decoder.n_vocab,
        "d_model": decoder.d,
        "k": args.k,
        "sentences": args.sentences,
        "batch_size": args.batch_size,
        "max_len": args.max_len,
        "torch_threads_per_worker": args.threads,
        "torch_version": torch.__version__,
        "runs": runs,
        "states_per_s_per_worker_median": rate,
        "states_per_sentence": runs[0]["states"] / args.sentences,
    }
    if tmp is not None:
        tmp.cleanup()
    log.info("dump: %.0f states/s per worker (%s)", rate, which)
    return result


def bench_kmeans(args) -> dict[str, object]:
    import faiss

    from fastvocab.artifacts_schema.digest import array_digest
    from fastvocab.tasks.kmeans import train_kmeans

    rng = np.random.default_rng(0)
    n, d, r = args.kmeans_n, args.kmeans_d, args.kmeans_r
    modes = rng.standard_normal((4 * r, d), dtype=np.float32) * 3  # more modes than centroids
    x = modes[rng.integers(0, len(modes), n)]
    x += rng.standard_normal((n, d), dtype=np.float32)
    mppc = -(-n // r)  # every state takes part (Faiss would subsample above r * max_points_per_centroid)
    log.info("k-means: n=%d d=%d r=%d niter=%d threads=%s", n, d, r, args.niter, args.kmeans_threads)
    t0 = time.perf_counter()
    centroids, info = train_kmeans(
        x, r, niter=args.niter, seed=1234, max_points_per_centroid=mppc, threads=args.kmeans_threads
    )
    wall = time.perf_counter() - t0
    log.info("k-means: %.1f s (train %.1f s)", wall, info.seconds)
    return {
        "n": n,
        "d": d,
        "r": r,
        "niter": args.niter,
        "iterations_run": len(info.objective),
        "n_train": info.n_train,
        "faiss_threads": info.threads,
        "faiss_version": faiss.__version__,
        "gpu": info.gpu,
        "train_seconds": info.seconds,
        "seconds_per_iteration": info.seconds / max(len(info.objective), 1),
        "objective_first_last": [info.objective[0], info.objective[-1]],
        "centroids_digest": array_digest(centroids),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (checks the script, not a result)")
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--shard", type=int, default=128)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads per dump worker")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kmeans-n", type=int, default=1_000_000)
    p.add_argument("--kmeans-d", type=int, default=512)
    p.add_argument("--kmeans-r", type=int, default=2000)
    p.add_argument("--niter", type=int, default=20)
    p.add_argument("--kmeans-threads", type=int, default=os.cpu_count())
    p.add_argument("--skip-dump", action="store_true")
    p.add_argument("--skip-kmeans", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.quick:
        args.sentences, args.shard, args.repeats = 32, 16, 1
        args.kmeans_n, args.kmeans_d, args.kmeans_r, args.niter = 20_000, 64, 100, 5
    result: dict[str, object] = {
        "benchmark": "dump throughput and faiss k-means time",
        "date": time.strftime("%Y-%m-%d"),
        "commit": git_commit(cwd=ROOT),
        "device": f"cpu: {cpu_name()}, {os.cpu_count()} cores",
        "load_average_at_start": load_avg(),
        "quick": args.quick,
    }
    if not args.skip_dump:
        result["dump"] = bench_dump(args)
    if not args.skip_kmeans:
        result["kmeans"] = bench_kmeans(args)
    result["load_average_at_end"] = load_avg()
    out = (
        args.out
        or ROOT
        / "benchmarks"
        / "results"
        / f"dump-kmeans-cpu-{result['date']}{'-quick' if args.quick else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""The data-scale curve: greedy fidelity of clustered sets against the dumped text, K, probes and r.

Reads a pipeline work dir that stored every state it dumped (``configs/demo-maps.yaml``: the whole corpus,
along the greedy path and the reference translations), decodes the test split greedily with full softmax,
and measures every point with ``experiments.coverage`` (a step *misses* when its best token is outside its
row's probed sets; a sentence with a miss is one whose clustered greedy output differs):

- nested prefixes of the dumped sentences (1,500, doubling, all: the sources file's order, train lines first,
  then the monolingual ones) x K x probes, at each r;
- at the full size and r = 1000: sets from the greedy states only, the reference states only, and both.

Writes ``benchmarks/results/data-scale-<device>-<date>.json`` and a PNG beside it (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from bench_meta import cpu_name, git_commit

from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.hidden_states import (
    REFERENCE_BEAM,
    beam_label,
    beam_roots,
    validate_direction,
)
from fastvocab.experiments import coverage
from fastvocab.tasks.context import RunContext, describe_model
from fastvocab.tasks.dump import DumpDecoder, DumpSettings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "demo-maps")
    p.add_argument("--model", type=Path, default=ROOT / "models" / "demo")
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--directions", default="en-it,it-en")
    p.add_argument(
        "--splits", default="dev,test", help="the splits whose greedy paths are measured (default: dev,test)"
    )
    p.add_argument("--sentences", type=int, default=None, help="first N sentences of the split (default all)")
    p.add_argument("--rs", type=_ints, default=[500, 1000, 2000])
    p.add_argument("--ks", type=_ints, default=[1, 3, 8])
    p.add_argument("--probes", type=_ints, default=[1, 2, 4, 8])
    p.add_argument("--first", type=int, default=1500, help="the curve's smallest dump (then doubling)")
    p.add_argument("--batch", type=int, default=32, help="sentences a batch for the union's columns")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = a.out or RESULTS / f"data-scale-cpu-{dt.date.today().isoformat()}.json"

    ref = describe_model(a.model)
    decoder = DumpDecoder(RunContext(ref, torch_threads=a.threads), DumpSettings(k=1, max_len=128))
    states = a.work_dir / "states"
    record: dict = {
        "meta": {
            "what": "greedy fidelity of clustered sets (coverage of full softmax's greedy path) by dump size",
            "device": cpu_name(),
            "threads": a.threads,
            "model": str(a.model),
            "model_fingerprint": ref.fingerprint,
            "N": ref.n_vocab,
            "work_dir": str(a.work_dir),
            "splits": a.splits,
            "batch": a.batch,
            "commit": git_commit(),
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": "python benchmarks/bench_data_scale.py "
            + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None and k != "out"
            ),
        },
        "directions": {},
    }
    for direction in a.directions.split(","):
        src, _, tgt = direction.partition("-")
        t0 = time.perf_counter()
        paths = {}
        for split in a.splits.split(","):
            _, sources, _ = read_direction(a.corpus, src, tgt, split, limit=a.sentences)
            paths[split] = coverage.greedy_path(decoder, sources, src, tgt)
        path_s = time.perf_counter() - t0
        by_path = {
            b: validate_direction(root, direction, fingerprint=ref.fingerprint)
            for b, root in beam_roots(states).items()
            if (root / f"direction={direction}").is_dir()
        }
        files = [f for b in sorted(by_path) for f in by_path[b]]
        labels = coverage.load_labels(files, max(a.ks))
        sizes = coverage.doubling_sizes(labels.dumped_sentences, a.first)
        print(
            f"{direction}: {labels.states:,} stored states of {labels.dumped_sentences:,} sentences "
            f"({', '.join(beam_label(b) for b in sorted(by_path))}); "
            f"{', '.join(f'{k} path {len(v.best):,} steps' for k, v in paths.items())} in {path_s:.0f} s",
            flush=True,
        )
        centroids = {r: coverage.train_centroids(files, r) for r in a.rs}
        t0 = time.perf_counter()
        grid = coverage.CoverageGrid(a.rs, a.ks, a.probes, batch=a.batch)
        rows = coverage.coverage_curve(
            labels, paths, ref.n_vocab, grid, sizes=sizes, centroids=centroids,
            always_active=decoder.adapter.always_active_ids(),
        )  # fmt: skip
        for row in rows:
            row["paths"] = "both"
        # which states make the sets: each path alone, at the full size, r = 1000 (or the first r)
        r0 = 1000 if 1000 in a.rs else a.rs[0]
        for b, fs in sorted(by_path.items()):
            if len(by_path) < 2:
                break
            alone = coverage.load_labels(fs, max(a.ks))
            part = coverage.coverage_curve(
                alone, paths, ref.n_vocab, replace(grid, rs=[r0]), sizes=[alone.dumped_sentences],
                centroids={r0: centroids[r0]}, always_active=decoder.adapter.always_active_ids(),
            )  # fmt: skip
            for row in part:
                row["paths"] = beam_label(b)
            rows += part
        for row in rows:
            if (
                row["paths"] == "both"
                and row["sentences"] == labels.dumped_sentences
                and row["split"] == "test"
            ):
                where = f"  r={row['r']} K={row['K']} probes={row['probes']}"
                print(
                    f"{where}: differ {100 * row['sentence_differ']:.1f}%, row {100 * row['row_cols']:.1f}% "
                    f"of N, union {100 * row['union_batch']:.1f}%",
                    flush=True,
                )
        record["directions"][direction] = {
            "stored_states": labels.states,
            "dumped_sentences": labels.dumped_sentences,
            "paths": [beam_label(b) for b in sorted(by_path)],
            "reference_path": REFERENCE_BEAM in by_path,
            "split_sentences": {k: v.sentences for k, v in paths.items()},
            "split_steps": {k: len(v.best) for k, v in paths.items()},
            "sizes": sizes,
            "curve_seconds": time.perf_counter() - t0,
            "rows": rows,
            "halving": {
                f"{split}-r{r}-K{k}-P{pr}": coverage.misses_per_doubling(
                    [x for x in rows_both(rows) if x["split"] == split], r, k, pr
                )
                for split in paths
                for r in a.rs
                for k in a.ks
                for pr in a.probes
            },
        }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out}")


def rows_both(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["paths"] == "both"]


def plot(record: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dirs = list(record["directions"])
    fig, axes = plt.subplots(1, len(dirs), figsize=(6 * len(dirs), 4.5), squeeze=False)
    for ax, d in zip(axes[0], dirs, strict=True):
        rows = [r for r in rows_both(record["directions"][d]["rows"]) if r["split"] == "test"]
        r0 = 1000 if any(r["r"] == 1000 for r in rows) else rows[0]["r"]
        for k in sorted({r["K"] for r in rows}):
            for pr in sorted({r["probes"] for r in rows}):
                pts = sorted(
                    (r["sentences"], r["sentence_differ"])
                    for r in rows
                    if (r["r"], r["K"], r["probes"]) == (r0, k, pr)
                )
                if pr in (1, 4, 8):
                    ax.plot(
                        [x for x, _ in pts],
                        [100 * y for _, y in pts],
                        marker="o",
                        label=f"K={k}, probes={pr}",
                    )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("dumped sentences (nested prefixes)")
        ax.set_ylabel("greedy outputs differing from full softmax (%)")
        ax.set_title(f"{d}, r={r0}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()

"""End-to-end benchmark: translation speed and quality, full softmax vs the clustered projection, one process.

    .venv/bin/python benchmarks/bench_e2e.py --model models/demo --maps runs/demo/maps --corpus data/corpus

For every direction and search configuration (``--configs``, beam x batch; default greedy batch 1 and beam 2
batch 20, the paper's Table 3 settings) it times ``tasks.translate.translate`` (model load excluded;
tokenizing and decoding included) with the full projection and each clustered variant (mode, and for beam > 1
the inactive-mass estimator), interleaved round by round after a warm-up, and reports the median of
``--repeats`` runs: generated tokens/s, sentences/s and the ratio against full measured in the same rounds.
Quality per variant: the search error rate against full softmax (share of outputs that differ, same search and
settings) and BLEU/chrF against the references (sacrebleu, signature recorded). An untimed pass records the
active fraction (computed columns / N per decoder row, mean over steps) and the hypotheses.

Writes ``benchmarks/results/e2e-<device>-<date>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_meta import ROOT, device_name

from fastvocab.artifacts_schema.cluster_map import resolve_map_dir
from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.provenance import git_commit
from fastvocab.kernels.base import Projection, ProjectionOutput

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class ActiveStats(Projection):
    """Wraps a projection and counts the columns it computes per row (for the untimed pass only)."""

    def __init__(self, inner: Projection) -> None:  # deliberately no super().__init__: a thin proxy
        self.inner = inner
        self.rows = 0
        self.columns = 0

    def __call__(self, h: torch.Tensor) -> ProjectionOutput:
        out = self.inner(h)
        self.rows += out.rows
        self.columns += int(out.active_columns().sum())
        return out

    def fraction(self) -> float:
        return self.columns / max(1, self.rows) / self.inner.n_vocab

    def tally(self) -> dict[str, float]:  # what translate's worker processes send back
        return {"rows": self.rows, "columns": self.columns}

    def add_tally(self, added: dict[str, float]) -> None:
        self.rows += int(added["rows"])
        self.columns += int(added["columns"])


def variants(configs_beam: int, args) -> list[tuple[str, dict]]:
    """(label, make_projection options) for one search configuration; full first."""
    out: list[tuple[str, dict]] = [("full", {})]
    masses = args.inactive_mass if configs_beam > 1 else ["none"]
    for mode in args.modes:
        for mass in masses:
            label = f"clustered/{mode}" + ("" if mass == "none" else f"/{mass}")
            out.append((label, {"selection": mode, "inactive_mass": mass}))
    return out


def projection_bytes(proj: Projection) -> int:
    """Memory the output layer holds besides W and b: the map's device tensors and cached blocks."""
    pm = getattr(proj, "prepared_map", None)  # the clustered projection's
    if pm is None:
        return 0
    tensors = [pm.centroids_t, pm.sq_norms, pm.indptr, pm.indices]
    return sum(t.numel() * t.element_size() for t in tensors) + pm.cached_bytes


def bench_direction(adapter, direction: str, args, make_projection, translate, score, search_error_rate):
    src_lang, _, tgt_lang = direction.partition("-")
    _, sources, refs = read_direction(args.corpus, src_lang, tgt_lang, args.split, limit=args.sentences)
    map_dir = resolve_map_dir(args.maps, src_lang, tgt_lang)
    records = []
    for beam, batch in args.configs:
        projs = {}
        for label, opts in variants(beam, args):
            if label == "full":
                projs[label] = make_projection(adapter, "full")
            else:
                projs[label] = make_projection(adapter, "clustered", cluster_map=map_dir, **opts)

        def run(proj, lines, beam=beam, batch=batch):
            return translate(
                adapter, proj, lines, src_lang, tgt_lang, beam=beam, batch_size=batch, max_len=args.max_len,
                progress=False,
            )  # fmt: skip

        # Untimed pass: hypotheses (decoding is deterministic) and active fractions.
        hyps, fractions, tokens, sentences = {}, {}, {}, {}
        for label, proj in projs.items():
            stats = ActiveStats(proj) if label != "full" else proj
            res = run(stats, sources)
            hyps[label], tokens[label], sentences[label] = res.hypotheses, res.target_tokens, res.sentences
            fractions[label] = stats.fraction() if isinstance(stats, ActiveStats) else 1.0
        for proj in projs.values():  # warm-up
            run(proj, sources[: max(batch, 8)])
        seconds: dict[str, list[float]] = {label: [] for label in projs}
        for _ in range(args.repeats):
            for label, proj in projs.items():  # interleaved: every variant once per round
                t0 = time.perf_counter()
                run(proj, sources)
                seconds[label].append(time.perf_counter() - t0)
        t_full = statistics.median(seconds["full"])
        for label, proj in projs.items():
            t = statistics.median(seconds[label])
            q = score(hyps[label], refs, tgt_lang)
            rec = {
                "direction": direction,
                "beam": beam,
                "batch": batch,
                "method": label,
                "signature": proj.signature(),
                "sentences": sentences[label],
                "target_tokens": tokens[label],
                "seconds_median": t,
                "seconds_all": seconds[label],
                "tokens_per_s": tokens[label] / t,
                "sentences_per_s": sentences[label] / t,
                "speedup_vs_full": t_full / t,
                "search_error_rate": search_error_rate(hyps[label], hyps["full"]),
                "bleu": q["bleu"],
                "chrf": q["chrf"],
                "bleu_signature": q["signatures"]["bleu"],
                "active_fraction": fractions[label],
                "output_layer_extra_bytes": projection_bytes(proj),
                "map": str(map_dir) if label != "full" else None,
            }
            records.append(rec)
            print(
                f"{direction:>6} beam {beam} batch {batch:>3}  {label:<28} "
                f"{rec['sentences_per_s']:>8.2f} sent/s "
                f"{rec['tokens_per_s']:>9.1f} tok/s  x{rec['speedup_vs_full']:>5.2f}  "
                f"SER {100 * rec['search_error_rate']:5.1f}%  BLEU {rec['bleu']:5.2f}  "
                f"active {100 * rec['active_fraction']:5.2f}%",
                flush=True,
            )
    return records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="model folder (e.g. models/demo)")
    p.add_argument("--maps", type=Path, required=True, help="maps root (<src>-<tgt>/, to-<tgt>/) or one map")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"), help="corpus folder")
    p.add_argument("--directions", default="en-it", help="comma-separated, e.g. en-it,it-en")
    p.add_argument("--split", default="test")
    p.add_argument("--sentences", type=int, default=200, help="first N sentences of the split")
    p.add_argument("--configs", default="1x1,2x20", help="beam x batch, comma-separated")
    p.add_argument("--modes", default="union,per-row")
    p.add_argument("--inactive-mass", default="none,centroid", help="estimators tried for beam > 1")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per variant (median reported)")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.directions = [d.strip() for d in args.directions.split(",") if d.strip()]
    args.configs = [tuple(int(v) for v in c.lower().split("x")) for c in args.configs.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",")]
    args.inactive_mass = [m.strip() for m in args.inactive_mass.split(",")]
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.tasks.evaluate import score, search_error_rate
    from fastvocab.tasks.projections import make_projection
    from fastvocab.tasks.translate import translate

    adapter = Seq2SeqAdapter.load(args.model, device=args.device, dtype=DTYPES[args.dtype])
    name = device_name(args.device)
    commit = git_commit(cwd=ROOT)
    print(
        f"# {name}, {args.dtype}, model {args.model} (N={adapter.n_vocab}, d={adapter.d_model}), "
        f"commit {commit}"
    )
    records = []
    for direction in args.directions:
        records += bench_direction(
            adapter, direction, args, make_projection, translate, score, search_error_rate
        )
    meta = {
        "device": args.device,
        "device_name": name,
        "dtype": args.dtype,
        "model": str(args.model),
        "model_fingerprint": adapter.fingerprint,
        "n_vocab": adapter.n_vocab,
        "d": adapter.d_model,
        "maps": str(args.maps),
        "corpus": str(args.corpus),
        "split": args.split,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "commit": commit,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    out = args.out or RESULTS / f"e2e-{args.device.split(':')[0]}-{dt.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": records}, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

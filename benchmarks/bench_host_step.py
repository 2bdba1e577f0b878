"""What the compiled CPU step saves, against the numpy and torch it replaced, on one thread: beam search's
candidates and advance, and the clustered projection's estimate of the left-out mass.

    .venv/bin/python benchmarks/bench_host_step.py --out benchmarks/results/host-step-cpu-DATE.json
    .venv/bin/python benchmarks/bench_host_step.py --against torch-candidates \
        --systems full:4:32:float32,clustered:4:32 --n 192 --chunk 32    # the candidates alone
    .venv/bin/python benchmarks/bench_host_step.py --quick      # a smoke run: 8 lines, one round

``translate``: the demo model's en-it test lines, each system (``--systems``: clustered with the shipped map
and shortlist, or full; int8 unless ``:float32``), one process on one thread, both ways alternating every
``--chunk`` lines (this machine's speed drifts by 1.5x within minutes, and whole runs alternating round by
round measured 0.83-1.96x for the same pair): each round's seconds of each way, their medians, each round's
ratio, and whether the outputs are the same.
``compiled`` is the step as it is (``decoding/host_beam_step.py``, ``kernels/host_moments.py``). It is
measured ``--against`` one of:
- ``numpy``, the step before it: each row's candidates by torch's log-softmax and blocked top-k, the beams'
  advance in numpy, the ``moments`` estimate in torch and numpy (kept below, as ``search.py`` and
  ``inactive_mass.py`` had them until 2026-11-29);
- ``torch-candidates``: the compiled step with torch's log-softmax and blocked top-k for the candidates
  (``search.COMPILED_CANDIDATES`` off), what every step wider than 8,192 scores ran until 2026-11-29.

``first_call_s``: what a fresh process pays before its first beam step: numba's import, then the first
call of the compiled functions (``host_beam_step.warm``), compiled into an empty cache (the first run on a
machine) or loaded from it (every later process), each in its own process.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from bench_meta import ROOT, result_header, round_order, write_result

from fastvocab.decoding import search
from fastvocab.kernels import inactive_mass

COMPILED = "compiled"
NUMPY = "numpy"
TORCH_CANDIDATES = "torch-candidates"


# ------------------------------------------------------------ the step before (numpy), to measure against


def _best_first(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def _numpy_advance(self, row_vals: torch.Tensor, row_toks: torch.Tensor, final: bool):
    v = self._views
    n, k = self.n, self.k
    vals = row_vals.numpy()
    kk = vals.shape[1]
    total = (vals.reshape(n, k, kk) + v["run_scores"][:, :, None]).reshape(n, k * kk)
    sent = np.arange(n)[:, None]
    flat = _best_first(total, 2 * k)
    cand_scores = total[sent, flat]
    cand_beam = flat // kk
    cand_toks = row_toks.numpy().reshape(n, k * kk)[sent, flat]
    step = int(v["step"][0])
    done_cand = np.ones(cand_toks.shape, dtype=bool) if final else cand_toks == self.eos
    if final or done_cand.any():
        new_fin = done_cand & self.top_k_mask.numpy()[: cand_toks.shape[1]] & ~v["done"][:, None]
        if new_fin.any():
            _numpy_merge(self, cand_scores, cand_beam, cand_toks, new_fin, step)
        scores = cand_scores + done_cand * np.float32(-1.0e9)
        pick = _best_first(scores, k)
        live, beam, toks = scores[sent, pick], cand_beam[sent, pick], cand_toks[sent, pick]
    else:
        live, beam, toks = cand_scores[:, :k], cand_beam[:, :k], cand_toks[:, :k]
    seqs = v["run_seqs"]
    seqs[:] = seqs[sent, beam]
    seqs[:, :, step] = toks
    v["run_scores"][:] = live
    done = v["done"]
    if final:
        done[:] = True
    elif self.pooled:
        now = v["fin_any"].all(axis=1)
        if self.rule is not True:
            never = self.rule == "never" and self.lp > 0
            at_len = np.float32(self.never_len) if never else v["denoms"][step]
            now &= v["run_scores"][:, 0] / at_len <= v["fin_scores"].min(axis=1)
        done |= now
    v["step"][0] = step + 1
    return torch.from_numpy(np.ascontiguousarray(toks)), torch.from_numpy(self.first_row.numpy() + beam)


def _numpy_merge(self, cand_scores, cand_beam, cand_toks, new_fin, step: int) -> None:
    v, k = self._views, self.k
    sent = np.arange(self.n)[:, None]
    self.pooled = True
    cand_seqs = v["run_seqs"][sent, cand_beam]
    cand_seqs[:, :, step] = cand_toks
    norm = cand_scores / v["denoms"][step] + ~new_fin * np.float32(-1.0e9)
    scores = np.concatenate([v["fin_scores"], norm], axis=1)
    sel = _best_first(scores, k)
    v["fin_seqs"][:] = np.concatenate([v["fin_seqs"], cand_seqs], axis=1)[sent, sel]
    v["fin_any"][:] = np.concatenate([v["fin_any"], new_fin], axis=1)[sent, sel]
    v["fin_scores"][:] = scores[sent, sel]


def _numpy_moments(hf, z, clusters, count: int, tables) -> torch.Tensor:
    if count <= 0:
        return torch.full((z.shape[0],), -math.inf)
    s1, s2 = inactive_mass._logit_sums(hf, tables)
    zs, zz = z.sum(dim=1), (z * z).sum(dim=1)
    n = np.float32(count)
    mean = (s1.numpy() - zs.numpy()) / n
    var = np.maximum((s2.numpy() - zz.numpy()) / n - mean * mean, np.float32(1e-6))
    stats = tables.per_cluster.numpy()[clusters.numpy()]
    est = _log_count(count, z.shape[0]) + mean + stats[:, 0] * (var / stats[:, 1])
    return torch.from_numpy(est)


@functools.lru_cache(maxsize=4096)
def _log_count(count: int, rows: int) -> np.ndarray:
    return torch.log(torch.full((rows,), float(count))).numpy()


_COMPILED_ADVANCE = search.BeamState._advance_host
_COMPILED_MOMENTS = inactive_mass._moments_union_cpu


def _use(way: str) -> None:
    numpy = way == NUMPY
    search.COMPILED_CANDIDATES = way == COMPILED
    search.BeamState._advance_host = _numpy_advance if numpy else _COMPILED_ADVANCE  # type: ignore[method-assign]
    inactive_mass._moments_union_cpu = _numpy_moments if numpy else _COMPILED_MOMENTS


# ------------------------------------------------------------------ measurements

_FIRST_CALL = """
import json, time
import fastvocab.kernels  # torch and the package, which a decoding process has imported already
t0 = time.perf_counter()
from fastvocab.decoding import host_beam_step
t1 = time.perf_counter()
host_beam_step.warm()
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first_calls": t2 - t1}))
"""


def bench_first_call(repeats: int) -> dict[str, list[dict[str, float]]]:
    """Seconds a fresh process pays: numba's import and the first call of both functions
    (``host_beam_step.warm``), into an empty cache (compiling) and from the cache that run left (loading)."""
    out: dict[str, list[dict[str, float]]] = {"compile": [], "load": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}  # numba looks there before beside the module
            for kind in out:
                text = subprocess.run(
                    [sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True, check=True, env=env
                ).stdout
                out[kind].append({key: round(s, 3) for key, s in json.loads(text.splitlines()[-1]).items()})
    print({"first_call_s": out}, flush=True)
    return out


def bench_translate(args) -> list[dict]:
    from fastvocab.artifacts_schema.corpus import read_direction
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.experiments.bench_methods import shortlist_folder
    from fastvocab.tasks.projections import clustered_options, make_projection
    from fastvocab.tasks.translate import SearchSettings, translate

    lines = read_direction(args.corpus, "en", "it", "test")[1][: args.n]
    exact = Seq2SeqAdapter.load(args.model)
    adapters = {"float32": Seq2SeqAdapter.load(args.model, engine="onnx")}
    adapters["int8"] = Seq2SeqAdapter.load(args.model, engine="onnx")
    adapters["int8"].quantize_int8()
    base = args.against
    rows = []
    for system in args.systems.split(","):
        method, beam, batch, dtype = [*system.split(":"), "int8"][:4]
        options = {}
        if method == "clustered":
            options = dict(
                cluster_map=args.maps / "en-it", shortlist=shortlist_folder(args.maps, "en-it"),
                **clustered_options("union", "auto", False, int(beam), None, True),
            )  # fmt: skip
        proj = make_projection(exact, method, int8=dtype == "int8", **options)
        settings = SearchSettings(beam=int(beam), batch_size=int(batch))
        seconds: dict[str, list[float]] = {base: [], COMPILED: []}
        outputs: dict[str, list[str]] = {}
        size = max(args.chunk, int(batch))  # whole batches
        chunks = [lines[i : i + size] for i in range(0, len(lines), size)]
        for i in range(args.rounds + 1):  # the first round warms both up, untimed
            took = {base: 0.0, COMPILED: 0.0}
            said: dict[str, list[str]] = {base: [], COMPILED: []}
            for c, chunk in enumerate(chunks):  # both ways chunk by chunk: the machine's drift hits both
                for way in round_order([base, COMPILED], i + c):
                    _use(way)
                    adapter = adapters[dtype]
                    r = translate(adapter, proj, chunk, "en", "it", settings, workers=1, progress=False)
                    took[way] += r.seconds
                    said[way] += r.hypotheses
            if i:
                for way, s in took.items():
                    seconds[way].append(round(s, 3))
            outputs = said
        med = {way: statistics.median(s) for way, s in seconds.items()}
        by_round = [round(a / b, 3) for a, b in zip(seconds[base], seconds[COMPILED], strict=True)]
        row = {
            "projection": f"{method} {dtype}",
            "beam": int(beam),
            "batch": int(batch),
            "lines": len(lines),
            "chunk_lines": size,
            "against": base,
            "seconds": seconds,
            f"{base}_median_s": med[base],
            f"{COMPILED}_median_s": med[COMPILED],
            "speedup": round(med[base] / med[COMPILED], 3),
            "speedup_by_round": by_round,
            # Both ways ran chunk by chunk within a round, so a round's ratio is a paired reading.
            "speedup_by_round_median": round(statistics.median(by_round), 3),
            "same_outputs": outputs[base] == outputs[COMPILED],
        }
        print(row, flush=True)
        rows.append(row)
    _use(COMPILED)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default in [("model", "models/demo"), ("corpus", "data/corpus"), ("maps", "models/demo-maps")]:
        p.add_argument(f"--{flag}", type=Path, default=ROOT / default)
    systems = "clustered:4:1,clustered:4:32,full:4:1"
    p.add_argument(
        "--systems",
        default=systems,
        help="method:beam:batch[:float32],... (int8 unless float32; default: %(default)s)",
    )
    p.add_argument(
        "--against",
        choices=[NUMPY, TORCH_CANDIDATES],
        default=NUMPY,
        help="the step to measure the compiled one against (module docstring; default: %(default)s)",
    )
    p.add_argument("--n", type=int, default=100, help="test lines to translate (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of each way (default: %(default)s)")
    p.add_argument(
        "--chunk",
        type=int,
        default=10,
        help="lines a way translates before the other's turn (at least a batch; default: %(default)s)",
    )
    p.add_argument("--quick", action="store_true", help="8 lines, one round, no first-call runs: a smoke run")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.n, args.rounds, args.systems, args.chunk = 8, 1, "clustered:4:1", 4
    result = {**result_header("host-step"), "threads": 1, "engine": "onnx", "model": str(args.model)}
    result["first_call_s"] = {} if args.quick else bench_first_call(3)
    result["translate"] = bench_translate(args)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

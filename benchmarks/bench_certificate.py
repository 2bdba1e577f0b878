"""Where the exactness certificate (``exact_k``) loses rows: how loose its bound is on the greedy test path.

Decodes each direction's ``--split`` greedily with full softmax, keeping every step's state ``h``, and reads
the clustered map(s) given. Per row (``c`` its nearest cluster, ``S_c`` that cluster's set, ``z = W h + b``):

- ``in_set``: the best logit lies in ``S_c`` -- the share any bound could certify at best (an oracle);
- ``per_column``: certified by the per-column Cauchy-Schwarz bound
  ``max_{i not in S_c} z_i(C_c) + ||w_i|| ||h - C_c||`` (what the certificate's blocks approximate);
- ``blocked``: certified by the bound the projection uses (``certificate.inactive_bounds``: columns in
  blocks of equal count by ``||w_i||``);
- ``subspace_m``: certified by a tighter, costlier bound that computes the residual ``h - C_c`` exactly along
  the ``m`` leading directions of the rows' residuals and Cauchy-Schwarz on the rest (``m`` x N
  multiply-adds a row). The directions are fitted on the rows themselves, so this is an optimistic bound.

It also records the medians that explain the gap: the best computed logit, the best left-out logit, each
bound, ``||h - C_c||`` and ``||h||``. Writes ``benchmarks/results/certificate-<device>-<date>.json``
(``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import time
from pathlib import Path

import torch
from bench_meta import cpu_name, git_commit, write_result

from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.experiments import coverage
from fastvocab.kernels.certificate import inactive_bounds
from fastvocab.tasks.context import RunContext, describe_model
from fastvocab.tasks.dump import DumpDecoder, DumpSettings
from fastvocab.tasks.projections import make_projection

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CHUNK = 2048  # rows whose full logits are held at once


def slack(h: torch.Tensor, proj, weight: torch.Tensor, bias: torch.Tensor | None, dims: list[int]) -> dict:
    """The shares and medians above for the rows ``h`` (rows, d) under the clustered projection ``proj``
    (built with ``exact_k=1``)."""
    pm, tables = proj.prepared_map, proj._bounds  # the bound tables the projection built at load
    n_vocab = weight.shape[0]
    clusters = proj.assign(h)
    members = torch.zeros((pm.r, n_vocab), dtype=torch.bool)
    for i, ids in enumerate(pm.ids):
        members[i, ids] = True
    cent = tables.centroids
    z_cent = torch.nn.functional.linear(cent, weight, bias)  # (r, N): the logits at each centroid
    w_norm = weight.norm(dim=1)
    resid = h - cent[clusters]
    delta = resid.norm(dim=1)
    basis = torch.linalg.svd(resid, full_matrices=False).Vh  # (d, d): the residuals' leading directions
    along = {m: weight @ basis[:m].T for m in dims}  # (N, m)
    across = {m: (weight - along[m] @ basis[:m]).norm(dim=1) for m in dims}  # (N,)
    cols = {"z_in": [], "z_out": [], "per_column": []} | {m: [] for m in dims}
    for lo in range(0, len(h), CHUNK):
        hh, cc, rr, dd = (t[lo : lo + CHUNK] for t in (h, clusters, resid, delta))
        active = members[cc]
        z = torch.nn.functional.linear(hh, weight, bias)
        cols["z_in"].append(z.masked_fill(~active, -math.inf).amax(1))
        cols["z_out"].append(z.masked_fill(active, -math.inf).amax(1))
        zc = z_cent[cc]
        cols["per_column"].append((zc + w_norm * dd[:, None]).masked_fill(active, -math.inf).amax(1))
        for m in dims:
            f = rr @ basis[:m].T  # (rows, m)
            rest = (rr - f @ basis[:m]).norm(dim=1)
            bound = zc + f @ along[m].T + across[m] * rest[:, None]
            cols[m].append(bound.masked_fill(active, -math.inf).amax(1))
    got = {k: torch.cat(v) for k, v in cols.items()}
    blocked, _ = inactive_bounds(h, clusters, tables)
    z_in = got["z_in"]

    def share(bound: torch.Tensor) -> float:
        return round(float((z_in > bound).float().mean()), 4)

    def med(x: torch.Tensor) -> float:
        return round(float(x.median()), 3)

    sizes = torch.tensor([len(ids) for ids in pm.ids], dtype=torch.float32)
    return {
        "rows": len(h),
        "r": pm.r,
        "set_columns_per_row": round(float(sizes[clusters].mean()) / n_vocab, 4),
        "blocks": int(tables.norm.numel()),
        "certified": {
            "in_set": share(got["z_out"]),
            "per_column": share(got["per_column"]),
            "blocked": share(blocked),
            **{f"subspace_{m}": share(got[m]) for m in dims},
        },
        "median": {
            "best_in_set": med(z_in),
            "best_left_out": med(got["z_out"]),
            "per_column_bound": med(got["per_column"]),
            "blocked_bound": med(blocked),
            "distance_to_centroid": med(delta),
            "norm_h": med(h.norm(dim=1)),
            "norm_w": med(w_norm),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--maps", type=Path, nargs="+", default=[ROOT / "models" / "demo-maps"], help="maps roots")
    p.add_argument("--model", type=Path, default=ROOT / "models" / "demo")
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--directions", default="en-it,it-en")
    p.add_argument("--split", default="test")
    p.add_argument("--subspace", default="16,32,64", help="dimensions m of the subspace bound")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dims = [int(x) for x in a.subspace.split(",") if x.strip()]
    out = a.out or RESULTS / f"certificate-cpu-{dt.date.today().isoformat()}.json"
    ref = describe_model(a.model)
    decoder = DumpDecoder(RunContext(ref, torch_threads=a.threads), DumpSettings(k=1, max_len=128))
    adapter = decoder.adapter
    weight = adapter.output_weight.float()
    bias = None if adapter.output_bias is None else adapter.output_bias.float()
    record: dict = {
        "meta": {
            "what": "how loose the exactness certificate's bound is on full softmax's greedy test path",
            "device": cpu_name(),
            "dtype": "float32",
            "model": str(a.model),
            "model_fingerprint": ref.fingerprint,
            "N": ref.n_vocab,
            "d": int(weight.shape[1]),
            "split": a.split,
            "commit": git_commit(),
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": "python benchmarks/bench_certificate.py --maps "
            + " ".join(str(m) for m in a.maps)
            + f" --directions {a.directions} --split {a.split} --subspace {a.subspace}",
        },
        "rows": [],
    }
    for direction in a.directions.split(","):
        src, _, tgt = direction.partition("-")
        t0 = time.perf_counter()
        sources = read_direction(a.corpus, src, tgt, a.split)[1]
        path = coverage.greedy_path(decoder, sources, src, tgt)
        for maps in a.maps:
            proj = make_projection(adapter, "clustered", cluster_map=maps / direction, exact_k=1)
            row = {"direction": direction, "maps": str(maps), **slack(path.hidden, proj, weight, bias, dims)}
            record["rows"].append(row)
            print(f"{direction} {maps}: certified {row['certified']}", flush=True)
        print(f"{direction}: {time.perf_counter() - t0:.0f} s", flush=True)
    write_result(out, record)


if __name__ == "__main__":
    main()

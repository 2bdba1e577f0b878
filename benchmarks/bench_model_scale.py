"""Decoding speed at the model sizes users run, on CPU: fastvocab (full, clustered; fp32, int8) against
CTranslate2 (float32, int8, int8 with a vocabulary map), on models built from configs with random weights.

    .venv/bin/python benchmarks/bench_model_scale.py --shapes m2m100-418m --batch 32 --beam 1 --threads 2
    .venv/bin/python benchmarks/bench_model_scale.py --shapes toy --repeats 1 --steps 2   # a smoke run

What the runs found, and how it builds the shapes and maps, times the systems and measures each point:
``docs/model-scale.md`` ("How the benchmark runs"); the dated runs: ``benchmarks/history/model-scale.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gc
import itertools
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from bench_meta import (
    RESULTS,
    ROOT,
    comma_list,
    load_avg,
    meminfo,
    provenance,
    reset_peak_rss,
    round_order,
    scratch_dir,
    write_result,
)
from bench_peer import Ct2System, convert_ct2

from fastvocab.kernels.int8 import many_rows_gemm

SRC, TGT = "en", "it"
LANGS = ["en", "it", "fr", "de"]
# M2M100's tokenizer adds 100 language codes and 8 made-up words to its vocab.json
MADE_UP_AND_CODES = 108
_WORD_TEXT = (
    "the a package for library tool data file system server client network graphics sound this provides "
    "support with and of to in is that it on as utility command line interface program module plugin "
    "extension documentation development files headers shared runtime python perl java kernel driver font "
    "theme game editor viewer manager daemon service configuration"
)
WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class Shape:
    d_model: int
    enc_layers: int
    dec_layers: int
    ffn: int
    heads: int
    vocab: int  # N, the model's vocab_size

    def params(self) -> int:
        d, f = self.d_model, self.ffn
        enc = self.enc_layers * (4 * d * d + 2 * d * f)
        dec = self.dec_layers * (8 * d * d + 2 * d * f)
        return enc + dec + self.vocab * d  # tied embeddings (biases and norms left out)


SHAPES: dict[str, Shape | None] = {
    "toy": Shape(64, 1, 1, 256, 2, 2_000),
    "demo": None,  # models/demo: its config decides
    "m2m100-418m": Shape(1024, 12, 12, 4096, 16, 128_112),
    "nllb-600m": Shape(1024, 12, 12, 4096, 16, 256_206),
    # M2M100 1.2B: FFN 8192 (1.24B parameters with this vocabulary)
    "1.2b": Shape(1024, 24, 24, 8192, 16, 128_112),
    # an OPUS-MT (Marian base) model's dimensions, CTranslate2's own headline benchmark: the same GEMMs a
    # step, in M2M100's layout (Marian's post-norm and sinusoidal positions cost nothing the step does not)
    "marian-base": Shape(512, 6, 6, 2048, 8, 58_101),
}
SYSTEMS = ["full-fp32", "full-int8", "clustered-fp32", "clustered-int8",
           "ct2-float32", "ct2-int8", "ct2-int8-vmap"]  # fmt: skip
FRACTIONS = [0.02, 0.05, 0.1, 0.2]


def memory_needed(shape: Shape, systems: list[str], fractions: list[float], args) -> dict[str, int]:
    """Bytes the asked systems hold at once (estimates: weights, copies, caches, maps), by component."""
    p, nd = shape.params(), shape.vocab * shape.d_model
    rows = max(args.batch) * max(args.beam) * max(args.threads)  # rows in flight at once (workers)
    positions = args.steps + 2
    cache = 2 * shape.dec_layers * shape.d_model * positions * 4 * rows
    cross = 2 * shape.dec_layers * shape.d_model * (args.src_words * 3) * 4 * rows
    d, f = shape.d_model, shape.ffn
    # the decoder layers' pre-packed float32 copies (kernels/prepack.py): QKV, cross Q, both outputs, FFN
    packed_layers = 4 * shape.dec_layers * (6 * d * d + 2 * d * f)
    # always loaded (the tokenizer)
    need = {"fastvocab fp32 model + packed W and decoder copies": 4 * p + 8 * nd + packed_layers}
    if any(s.endswith("int8") and not s.startswith("ct2") for s in systems):
        # measured at m2m100-418m: the int8 load adds ~1.9x its fp32 weights (the fp32 load stays, plus the
        # quantized copies of the engine's linears); the packed copies live until the layers are quantised
        need["fastvocab int8 model (fp32 load + int8 copies + int8 W)"] = 8 * p + nd + packed_layers
    if any(s.startswith("clustered") or s == "ct2-int8-vmap" for s in systems):
        nnz = args.clusters * shape.vocab * sum(fractions)
        projections = max(1, sum(1 for s in systems if s.startswith("clustered")))  # a map each
        need["cluster maps (ids, counts, prepared sets) + sub-matrix caches"] = projections * (
            int(24 * nnz) + len(fractions) * (512 << 20)
        )
    if "clustered-int8" in systems:
        # each int8 clustered projection's own int8 W: fbgemm's packed layer (packed + unpacked int8), the
        # rows it gathers (int8) and the popularity-ordered packed blocks (packed + unpacked), plus a float32
        # copy of W while the layer is built (freed after)
        need["int8 clustered W (packed layer and blocks, their copies, gathered rows)"] = (
            len(fractions) * 5 * nd + 4 * nd
        )
    if "ct2-float32" in systems:
        need["ct2 float32"] = 4 * p
    if "ct2-int8" in systems or "ct2-int8-vmap" in systems:
        need["ct2 int8"] = p * (1 + sum(1 for s in systems if s == "ct2-int8-vmap") * len(fractions))
    need["decoder caches and logits"] = cache + cross + 3 * 4 * rows * shape.vocab
    return need


def check_memory(name: str, shape: Shape, systems: list[str], fractions: list[float], args) -> dict:
    need, have = memory_needed(shape, systems, fractions, args), meminfo("MemAvailable")
    total = sum(need.values())
    report = {
        "needed_mib": {k: round(v / 2**20) for k, v in need.items()},
        "available_mib": round(have / 2**20),
    }
    if total > have:
        parts = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in need.items())
        raise SystemExit(
            f"bench_model_scale: shape {name} does not fit: needs ~{total / 2**30:.1f} GiB ({parts}), "
            f"{have / 2**30:.1f} GiB available; run fewer --systems, --active fractions or a smaller --batch"
        )
    return report


def random_lines(n: int, words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=words)) for _ in range(n)]


def padded_sentencepiece(work: Path, pieces: int) -> Path:
    """A SentencePiece model trained on synthetic lines, its piece list padded to ``pieces`` entries."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    from fastvocab.training.demo_model import train_sentencepiece

    spm = train_sentencepiece(random_lines(400, 12, seed=1), min(200, pieces), work / "spm-small", threads=1)
    m = pb.ModelProto()
    m.ParseFromString(spm.read_bytes())
    have = {p.piece for p in m.pieces}
    if len(m.pieces) > pieces:
        raise ValueError(f"{pieces} pieces asked, the trained model has {len(m.pieces)}")
    low = min(p.score for p in m.pieces if p.type == pb.ModelProto.SentencePiece.NORMAL)
    i = 0
    while len(m.pieces) < pieces:
        piece = f"\u2581tok{i}"
        i += 1
        if piece in have:
            continue
        new = m.pieces.add()
        new.piece, new.score, new.type = piece, low - 1.0 - i * 1e-6, pb.ModelProto.SentencePiece.NORMAL
    m.trainer_spec.vocab_size = pieces
    out = work / "spm-padded" / "spm.model"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(m.SerializeToString())
    return out


def build_shape(name: str, shape: Shape, folder: Path) -> dict:
    """``<folder>/model`` (HF) for ``shape``; returns what building took."""
    from transformers import M2M100ForConditionalGeneration

    from fastvocab.training.demo_model import build_tokenizer, model_config

    t0 = time.perf_counter()
    out = folder / "model"
    scratch = Path(tempfile.mkdtemp(prefix="spm-", dir=folder))
    pieces = shape.vocab - MADE_UP_AND_CODES
    for _ in range(2):  # a second try corrects the piece count by what the tokenizer added
        shutil.rmtree(out, ignore_errors=True)
        tok = build_tokenizer(padded_sentencepiece(scratch, pieces), LANGS, out)
        n = len(tok) + tok.num_madeup_words
        if n == shape.vocab:
            break
        pieces -= n - shape.vocab
    else:
        raise RuntimeError(f"{name}: tokenizer vocabulary {n} != {shape.vocab}")
    shutil.rmtree(scratch, ignore_errors=True)
    torch.manual_seed(0)
    config = model_config(asdict(shape), tok, max_positions=1024, dropout=0.0)  # its keys are Shape's fields
    model = M2M100ForConditionalGeneration(config).eval()
    assert model.config.vocab_size == shape.vocab and model.get_output_embeddings().bias is None
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return {"build_s": round(time.perf_counter() - t0, 1)}


def shape_of(model_dir: Path) -> Shape:
    c = json.loads((model_dir / "config.json").read_text())
    keys = ("d_model", "encoder_layers", "decoder_layers", "decoder_ffn_dim", "decoder_attention_heads")
    return Shape(*(c[k] for k in keys), c["vocab_size"])


def du_mib(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def prepare_shape(name: str, args, systems: list[str]) -> tuple[Path, Path | None, Shape, dict]:
    """(HF model folder, CT2 folder or None, shape, info): built and converted once, cached under --root."""
    folder = Path(args.root) / name
    folder.mkdir(parents=True, exist_ok=True)
    if name == "demo":
        model_dir = ROOT / "models" / "demo"
        shape = shape_of(model_dir)
    else:
        shape = SHAPES[name]
        assert shape is not None
        model_dir = folder / "model"
    info: dict = {"memory": check_memory(name, shape, systems, args.active, args)}
    marker = folder / "shape.json"
    built = json.loads(marker.read_text()) if marker.exists() else {}
    if name != "demo" and built.get("shape") != asdict(shape):
        print(f"{name}: building {shape}", file=sys.stderr, flush=True)
        built = {"shape": asdict(shape), **build_shape(name, shape, folder)}
        marker.write_text(json.dumps(built, indent=1) + "\n")
    ct2_dir = folder / "ct2"
    if any(s.startswith("ct2") for s in systems) and not (ct2_dir / "model.bin").exists():
        print(f"{name}: converting to CTranslate2", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        convert_ct2(model_dir, ct2_dir)
        built["convert_s"] = round(time.perf_counter() - t0, 1)
        marker.write_text(json.dumps(built, indent=1) + "\n")
    info.update(built, model_dir=str(model_dir), disk_mib={"model": du_mib(model_dir)})
    if converted := (ct2_dir / "model.bin").exists():
        info["disk_mib"]["ct2"] = du_mib(ct2_dir)
    return model_dir, ct2_dir if converted else None, shape, info


def load_adapter(model_dir: Path, fingerprint: str | None, int8: bool, engine: str = "static"):
    """The model on ``engine`` with EOS suppressed (every sentence runs to max_len) and the forced EOS off."""
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    a = Seq2SeqAdapter.load(model_dir, fingerprint=fingerprint, engine=engine)
    a.model.generation_config.suppress_tokens = [a.eos_id]
    a.forced_eos_id = None
    if int8:
        a.quantize_int8()
    return a


def zipf_pool(n: int, zipf: float, seed: int) -> np.ndarray:
    """Log-weights of the N ids: ``-zipf * log(rank)`` over a random ranking of the vocabulary."""
    rng = np.random.default_rng(seed)
    rank = np.empty(n, dtype=np.int64)
    rank[rng.permutation(n)] = np.arange(1, n + 1)
    return -zipf * np.log(rank.astype(np.float64))


def hidden_states(adapter, projection, count: int, args) -> np.ndarray:
    """``count`` decoder states of the model's greedy decoding of random lines (the synthetic centroids)."""
    from fastvocab.decoding.search import decode
    from fastvocab.decoding.settings import SearchSettings

    steps = 16
    lines = random_lines(max(1, math.ceil(count / steps)), args.src_words, seed=2)
    batch = adapter.pad(adapter.tokenize(lines, SRC, TGT))
    states: list[torch.Tensor] = []
    with torch.inference_mode():
        search = SearchSettings(max_len=steps)
        decode(adapter, projection, batch, SRC, TGT, search, step_hook=lambda r: states.append(r.hidden))
    h = torch.cat(states).float().numpy()
    return h[np.random.default_rng(3).permutation(len(h))[:count]]


def synthetic_sets(n: int, r: int, frac: float, zipf: float) -> tuple[np.ndarray, np.ndarray]:
    """``r`` sets of ``round(frac * n)`` ids each, drawn by :func:`zipf_pool`'s weights: (indptr, indices)."""
    m = max(1, round(frac * n))
    logw = zipf_pool(n, zipf, seed=0)
    rng = np.random.default_rng(1)
    sets = []
    for _ in range(r):
        keys = logw - np.log(-np.log(rng.random(n)))  # Gumbel top-m: a weighted draw without replacement
        sets.append(np.sort(np.argpartition(-keys, m - 1)[:m]).astype(np.int32))
    indptr = np.concatenate([[0], np.cumsum([len(s) for s in sets])]).astype(np.int64)
    return indptr, np.concatenate(sets)


def synthetic_map(adapter, centroids: np.ndarray, frac: float, args, out: Path):
    """A cluster map folder of Zipf-drawn sets (module docstring), loaded back if built before."""
    from fastvocab.artifacts_schema.cluster_map import (
        ClusterMap,
        MapManifest,
        active_fraction_stats,
        load_cluster_map,
        save_cluster_map,
    )

    if (out / "manifest.json").exists():
        return load_cluster_map(out, expect_fingerprint=adapter.fingerprint)
    n, r = adapter.n_vocab, len(centroids)
    indptr, indices = synthetic_sets(n, r, frac, args.zipf)
    c = centroids.astype(np.float32)
    manifest = MapManifest(
        model_fingerprint=adapter.fingerprint, direction=f"{SRC}-{TGT}", scope="direction", r=r, k=0,
        d=adapter.d_model, n_vocab=n, niter=0, seed=0, states_used=r,
        active_fraction=active_fraction_stats(indptr, n),
        extra={"synthetic": {"fraction": frac, "zipf": args.zipf, "centroids": "decoder states"}},
    )  # fmt: skip
    cmap = ClusterMap(manifest, c, (c * c).sum(1), indptr, indices, np.ones(indptr[-1], np.int32))
    save_cluster_map(cmap, out)
    return cmap


def union_growth(cmap, rows=(1, 8, 32, 128), draws: int = 16, weighted: bool = False) -> dict[str, float]:
    """Mean union fraction of ``rows`` clusters drawn with replacement, uniformly or (``weighted``) in
    proportion to their prediction counts."""
    indptr, indices, n = cmap.indptr, cmap.indices, cmap.manifest.n_vocab
    p = None
    if weighted:
        weights = np.add.reduceat(cmap.counts.astype(np.float64), indptr[:-1]) * (np.diff(indptr) > 0)
        p = weights / np.sum(weights)
    rng = np.random.default_rng(0)

    def union(m: int) -> float:
        mask = np.zeros(n, dtype=bool)
        for c in rng.choice(len(indptr) - 1, size=m, replace=True, p=p):
            mask[indices[indptr[c] : indptr[c + 1]]] = True
        return mask.mean()

    return {str(m): round(float(np.mean([union(m) for _ in range(draws)])), 5) for m in rows}


def real_union_growth(path: str) -> dict:
    from fastvocab.artifacts_schema.cluster_map import load_cluster_map

    if not Path(path, "manifest.json").exists():
        msg = f"skipped: no cluster map at {path} (make demo builds it)"
        print(f"bench_model_scale: union-growth check {msg}", file=sys.stderr)
        return {"map": path, "skipped": msg}
    cmap = load_cluster_map(path)
    return {
        "map": path, "r": cmap.manifest.r, "n_vocab": cmap.manifest.n_vocab,
        "active_fraction_mean": cmap.manifest.active_fraction.get("mean"),
        "union_fraction": union_growth(cmap, weighted=True),
    }  # fmt: skip


def vmap_model_dir(ct2_dir: Path) -> Path:
    """A folder with the converted model's files linked, for a ``vmap.txt`` of its own (what
    ``ct2-transformers-converter --vocab_mapping`` would add), so ``ct2_dir`` itself stays as it is."""
    out = scratch_dir("ct2-vmap-") / "model"
    out.mkdir()
    for f in ct2_dir.iterdir():
        if f.name != "vmap.txt":
            (out / f.name).symlink_to(f.resolve())
    return out


def write_vmap(adapter, count: int, logw: np.ndarray, path: Path) -> int:
    """A vocabulary map whose always-allowed line holds the ``count`` most popular ids of the pool (and the
    always-active ids); returns the number of tokens written."""
    from fastvocab.tasks.shortlist import vocabulary_tokens

    tokens = vocabulary_tokens(adapter)
    ids = [*adapter.always_active_ids(), *np.argsort(-logw).tolist()]
    usable = (
        s for s in map(tokens.__getitem__, dict.fromkeys(ids)) if s and not any(c in s for c in " \t\n")
    )
    keep = list(itertools.islice(usable, count))
    path.write_text("\t" + " ".join(keep) + "\n", encoding="utf-8")
    return len(keep)


class FixedStepsCt2(Ct2System):
    """``bench_peer.Ct2System`` decoding exactly ``max_len`` tokens a sentence, counting them."""

    tokens = 0

    def _translate(self, src: list[list[str]], beam: int, **kw) -> list:
        steps = self.args.max_len + 1  # + the forced language tag of the target prefix
        res = super()._translate(src, beam, min_decoding_length=steps, **kw)
        self.tokens += sum(len(r.hypotheses[0]) - 1 for r in res)
        return res

    def run(self, lines: list[str], beam: int) -> tuple[float, int]:
        self.tokens = 0
        seconds, _ = self(lines, beam)
        return seconds, self.tokens


def fastvocab_run(adapter, projection, ns):
    from fastvocab.tasks.translate import SearchSettings, translate

    def run(lines: list[str], beam: int) -> tuple[float, int]:
        torch.set_num_threads(ns.threads)  # a ctranslate2.Translator resets the calling thread's count
        r = translate(
            adapter, projection, lines, SRC, TGT,
            SearchSettings(beam=beam, batch_size=ns.batch_size, max_len=ns.max_len), progress=False,
            workers=None if ns.parallel == "workers" else 1,
        )  # fmt: skip
        return r.seconds, r.target_tokens

    return run


def gemm_peak(threads: int, repeats: int = 30) -> float:
    """fp32 GFLOP/s of torch.mm (256 x 1024) x (1024 x 4096) on ``threads`` threads: the fastest of
    ``repeats`` calls (a peak: on a shared machine the median reads the neighbours' load)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(256, 1024), torch.randn(1024, 4096)
    for _ in range(3):
        torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * 256 * 1024 * 4096 / best / 1e9


def decode_flops(
    shape: Shape, src_len: int, sentences: int, steps: int, beam: int, u: float, r: int
) -> float:
    """Multiply-adds x 2 of encoding ``sentences`` lines of ``src_len`` tokens and decoding ``steps`` tokens
    (after the 2-token prefix) for ``sentences x beam`` rows: encoder layers (QKVO, FFN, attention), decoder
    layers (self QKVO, cross Q and O, cross K and V once per sentence, FFN, both attentions at their
    lengths), the projection over ``u`` of the columns (plus the cluster assignment, ``r`` > 0)."""
    d, f, s = shape.d_model, shape.ffn, src_len
    enc = sentences * s * shape.enc_layers * (8 * d * d + 4 * d * f + 4 * d * s)
    cross_kv = sentences * shape.dec_layers * 4 * d * d * s
    rows = sentences * beam
    dec = 0.0
    for t in range(2 + steps - 1):  # prefix 2 tokens, then steps - 1 fed tokens
        dec += rows * shape.dec_layers * (12 * d * d + 4 * d * f + 4 * d * (t + 1) + 4 * d * s)
    proj = rows * steps * (2 * d * shape.vocab * u + (2 * d * r if r else 0))
    return enc + cross_kv + dec + proj


def union_without_skip(proj, run: Callable[[], object], n_vocab: int) -> float:
    """The map's union fraction over ``run()`` with the int8 projection's ``full_when_cheaper`` off: the
    columns the map gives, where the timed runs computed all N at the row counts whose expected union costs
    more."""
    was = proj.full_when_cheaper
    proj.full_when_cheaper = False
    proj.reset_counters()
    try:
        run()
        return proj.stats()["active_columns_per_row"] / n_vocab
    finally:
        proj.full_when_cheaper = was
        proj.reset_counters()


def project_all(proj, hs: list[torch.Tensor]) -> None:
    for x in hs:
        proj(x)


@torch.inference_mode()
def step_profile(
    adapter, full, clustered: dict, lines: list[str], batch: int, beam: int, steps: int, threads: int
):
    """Times of ``steps`` decoder steps and full projections (rows = batch x beam) on ``threads`` threads,
    then of each clustered projection on the same states (after one call); returns (s_full, {key: (s, u)})."""
    torch.set_num_threads(threads)
    b = adapter.pad(adapter.tokenize(lines[:batch], SRC, TGT))
    state = adapter.encode(b)
    prefix = adapter.start_tokens(TGT)
    state.positions = len(prefix) + steps - 1
    rows = b["input_ids"].shape[0]
    for tok in prefix:
        h, state = adapter.decoder_step(torch.full((rows,), tok, dtype=torch.long), state)
    if beam > 1:
        index = torch.arange(rows).repeat_interleave(beam)
        state, h = adapter.reorder(state, index, group=beam), h.index_select(0, index)
    gen = torch.Generator().manual_seed(0)
    t_proj = t_dec = 0.0
    hs = []
    for t in range(steps):
        hs.append(h)
        t0 = time.perf_counter()
        full(h)
        t1 = time.perf_counter()
        if t < steps - 1:
            tokens = torch.randint(4, adapter.n_vocab, (h.shape[0],), generator=gen)
            h, state = adapter.decoder_step(tokens, state)
        t2 = time.perf_counter()
        t_proj, t_dec = t_proj + t1 - t0, t_dec + t2 - t1
    out = {}
    for key, proj in clustered.items():
        proj(hs[0])  # a first call may load compiled code (the int8 gather's loop): not a step's time
        proj.reset_counters()
        t0 = time.perf_counter()
        project_all(proj, hs)
        tc = time.perf_counter() - t0
        stats = proj.stats()
        u = stats["active_columns_per_row"] / adapter.n_vocab
        if stats["full_fraction"]:
            u = union_without_skip(proj, functools.partial(project_all, proj, hs), adapter.n_vocab)
        proj.reset_counters()
        out[key] = (tc / (tc + t_dec), u)
    return t_proj / (t_proj + t_dec), out


def system_label(key: str, frac: float | None) -> str:
    return key if frac is None else f"{key} {100 * frac:g}%"


@dataclass
class Loaded:
    """A shape's models and projections, loaded once and shared by its points: the fp32 adapter and full
    projection, their int8 twins (when an int8 system runs), the clustered projections by dtype and active
    fraction, the converted CTranslate2 model, and the synthetic pool's log-weights (for the vmap)."""

    name: str
    shape: Shape
    a32: Any
    full32: Any
    a8: Any = None
    full8: Any = None
    clustered: dict[str, dict[float, Any]] = field(default_factory=lambda: {"fp32": {}, "int8": {}})
    ct2_dir: Path | None = None
    logw: np.ndarray = field(default_factory=lambda: np.zeros(0))


def run_shape(name: str, args, result: dict) -> None:
    from fastvocab.tasks.projections import make_projection

    systems = args.systems
    model_dir, ct2_dir, shape, info = prepare_shape(name, args, systems)
    print(f"{name}: {shape}", file=sys.stderr, flush=True)
    fingerprint = info.get("fingerprint")
    rss0 = meminfo("VmRSS")
    a32 = load_adapter(model_dir, fingerprint, int8=False, engine=args.engine)
    info["engine"] = a32.engine
    if fingerprint is None and name != "demo":
        info["fingerprint"] = a32.fingerprint
        marker = Path(args.root) / name / "shape.json"
        marker.write_text(
            json.dumps({**json.loads(marker.read_text()), "fingerprint": a32.fingerprint}, indent=1)
        )
    m = Loaded(name, shape, a32, make_projection(a32, "full"), ct2_dir=ct2_dir)
    m.logw = zipf_pool(a32.n_vocab, args.zipf, seed=0)
    load_mib = {"fastvocab fp32": (meminfo("VmRSS") - rss0) / 2**20}
    if any(s in systems for s in ("full-int8", "clustered-int8")):
        rss0 = meminfo("VmRSS")
        m.a8 = load_adapter(model_dir, a32.fingerprint, int8=True, engine=args.engine)
        m.full8 = make_projection(a32, "full", int8=True)  # the int8 option of full
        load_mib["fastvocab int8"] = (meminfo("VmRSS") - rss0) / 2**20
    maps_info = {}
    if any(s.startswith("clustered") or s == "ct2-int8-vmap" for s in systems):
        maps_info = clustered_projections(m, args, info)
    info.update(load_rss_mib={k: round(v) for k, v in load_mib.items()}, synthetic_maps=maps_info)
    result["shapes"][name] = {"shape": asdict(shape), "params": shape.params(), **info}

    only_1t = args.one_thread_batch
    if only_1t is None:
        only_1t = [32] if len(args.threads) > 1 else []
    for threads, batch, beam in itertools.product(args.threads, args.batch, args.beam):
        if not (threads == 1 and only_1t and batch not in only_1t):
            run_point(m, args, result, threads, batch, beam)


def clustered_projections(m: Loaded, args, info: dict) -> dict:
    """A synthetic map a ``--active`` fraction (built once, loaded after), and the clustered projections the
    systems asked for over each, into ``m.clustered``; returns what each map took and holds."""
    from fastvocab.tasks.projections import make_projection

    r, maps_info = args.clusters, {}
    dirs = {f: Path(args.root) / m.name / "maps" / f"a{f:g}-r{r}-z{args.zipf:g}" for f in args.active}
    centroids = np.zeros((0, m.a32.d_model), np.float32)  # built maps are loaded, not drawn again
    if not all((d / "manifest.json").exists() for d in dirs.values()):
        t0 = time.perf_counter()
        centroids = hidden_states(m.a32, m.full32, r, args)
        info["centroid_states_s"] = round(time.perf_counter() - t0, 1)
    for frac, out in dirs.items():
        t0 = time.perf_counter()
        cmap = synthetic_map(m.a32, centroids, frac, args, out)
        maps_info[f"{frac:g}"] = {
            "dir": str(out), "build_or_load_s": round(time.perf_counter() - t0, 1), "disk_mib": du_mib(out),
            "union_fraction": union_growth(cmap),
        }  # fmt: skip
        opts = {"cluster_map": out, "selection": args.selection, "inactive_mass": args.inactive_mass}
        built_s = maps_info[f"{frac:g}"]["projection_build_s"] = {}
        for dtype, system in (("fp32", "clustered-fp32"), ("int8", "clustered-int8")):
            if system in args.systems:  # the int8 option: W quantised as full int8's
                t0 = time.perf_counter()
                m.clustered[dtype][frac] = make_projection(m.a32, "clustered", int8=dtype == "int8", **opts)
                built_s[dtype] = round(time.perf_counter() - t0, 1)
        del cmap
    return maps_info


# label -> (run, system key, active fraction or None, dtype)
Runs = dict[str, tuple[Callable[[list[str], int], tuple[float, int]], str, float | None, str]]


def point_systems(m: Loaded, ns: SimpleNamespace, lines: list[str], beam: int, systems: list[str]):
    """The point's systems (:data:`Runs`), the vmap systems' candidate counts by fraction, and the labels
    already run once (a clustered system whose union sized a vmap)."""
    runs: Runs = {}
    if "full-fp32" in systems:
        runs["fastvocab full fp32"] = (fastvocab_run(m.a32, m.full32, ns), "full-fp32", None, "fp32")
    if "full-int8" in systems:
        runs["fastvocab full int8"] = (fastvocab_run(m.a8, m.full8, ns), "full-int8", None, "int8")
    for dtype, adapter in (("fp32", m.a32), ("int8", m.a8)):
        for frac, proj in m.clustered[dtype].items():
            label = system_label(f"fastvocab clustered {dtype}", frac)
            runs[label] = (fastvocab_run(adapter, proj, ns), f"clustered-{dtype}", frac, dtype)
    vmap_count: dict[float, int] = {}
    warm: set[str] = set()
    if m.ct2_dir is None:
        return runs, vmap_count, warm
    for dtype in ("float32", "int8"):
        if f"ct2-{dtype}" in systems:
            runs[f"ct2 {dtype}"] = (
                FixedStepsCt2(m.ct2_dir, dtype, m.a32, ns).run, f"ct2-{dtype}", None, dtype,
            )  # fmt: skip
    if "ct2-int8-vmap" in systems:
        prec = "int8" if m.clustered["int8"] else "fp32"
        for frac, proj in m.clustered[prec].items():
            # the clustered union over this point's lines (an untimed run, which is also the clustered
            # system's warm-up): the vmap gets that many candidates
            label = system_label(f"fastvocab clustered {prec}", frac)
            u = union_without_skip(proj, functools.partial(runs[label][0], lines, beam), m.a32.n_vocab)
            warm.add(label)
            vdir = vmap_model_dir(m.ct2_dir)
            vmap_count[frac] = write_vmap(m.a32, max(1, round(u * m.a32.n_vocab)), m.logw, vdir / "vmap.txt")
            system = FixedStepsCt2(vdir, "int8", m.a32, ns, use_vmap=True)
            runs[system_label("ct2 int8 + vmap", frac)] = (system.run, "ct2-int8-vmap", frac, "int8")
    return runs, vmap_count, warm


@dataclass
class Rounds:
    """What a point's timed rounds measured, by system label: seconds, peak RSS and the peak above the run's
    start (MiB), the clustered projections' union fractions and rows that skipped the map, tokens generated,
    the map's own union where steps skipped it, and the load average before and after."""

    times: dict[str, list[float]]
    rss: dict[str, list[float]]
    rss_run: dict[str, list[float]]
    union: dict[str, list[float]]
    full_rows: dict[str, list[float]]
    tokens: dict[str, int] = field(default_factory=dict)
    map_union: dict[str, float] = field(default_factory=dict)
    load: tuple[float, ...] = ()
    load_after: tuple[float, ...] = ()


def timed_rounds(
    m: Loaded, runs: Runs, lines: list[str], beam: int, expected: int, args, where: str
) -> Rounds:
    """``--repeats`` rounds of every system in :func:`round_order`; each must generate ``expected`` tokens."""
    r = Rounds(*({k: [] for k in runs} for _ in range(5)), load=os.getloadavg())  # type: ignore[arg-type]
    for i in range(args.repeats):
        for label, (run, _key, frac, dtype) in round_order(list(runs.items()), i):
            proj = m.clustered[dtype].get(frac) if label.startswith("fastvocab clustered") else None
            if proj is not None:
                proj.reset_counters()
            base = meminfo("VmRSS")
            reset_peak_rss()
            seconds, tok = run(lines, beam)
            hwm = meminfo("VmHWM")
            r.times[label].append(seconds)
            r.rss[label].append(hwm / 2**20)
            r.rss_run[label].append((hwm - base) / 2**20)
            if proj is not None:
                stats = proj.stats()
                r.union[label].append(stats["active_columns_per_row"] / m.a32.n_vocab)
                if stats["full_fraction"] is not None:
                    r.full_rows[label].append(stats["full_fraction"])
            if r.tokens.setdefault(label, tok) != tok or tok != expected:
                raise RuntimeError(f"{label}: {tok} tokens generated, expected {expected}")
            print(f"{where} round {i + 1}: {label} {seconds:.2f} s", file=sys.stderr, flush=True)
    r.load_after = os.getloadavg()
    for label, (run, _key, frac, dtype) in runs.items():
        if any(r.full_rows[label]):
            # steps that skipped the map computed all N: the map's own union comes from one untimed run
            # with the skip off (what `u` and the bound are defined on)
            again = functools.partial(run, lines, beam)
            r.map_union[label] = union_without_skip(m.clustered[dtype][frac], again, m.a32.n_vocab)
    return r


def run_point(m: Loaded, args, result: dict, threads: int, batch: int, beam: int) -> None:
    workers = args.parallel == "workers"
    n = args.sentences or max(batch, 4) * (threads if workers else 1)  # a batch per worker
    # the GEMM peak at this point's threads, measured again per point (the best seen is kept in the meta)
    peak = round(gemm_peak(threads), 1)
    seen = result["gemm_peak_gflops"]
    seen[str(threads)] = max(seen.get(str(threads), 0.0), peak)
    lines = random_lines(n, args.src_words)
    src_len = max(len(x) for x in m.a32.tokenize(lines, SRC, TGT))
    ns = SimpleNamespace(threads=threads, batch_size=batch, max_len=args.steps, parallel=args.parallel)
    ns.src_lang, ns.tgt_lang = SRC, TGT
    intra = 1 if workers else threads
    # the projection's share and the clustered unions, apart from the timed rounds
    prof: dict[str, tuple[float, dict]] = {}
    wanted = {"fp32": any(s.endswith("fp32") for s in args.systems), "int8": m.a8 is not None}
    for prec, adapter, full in (("fp32", m.a32, m.full32), ("int8", m.a8, m.full8)):
        if wanted[prec]:
            prof[prec] = step_profile(adapter, full, m.clustered[prec], lines, batch, beam, args.steps, intra)
    runs, vmap_count, warm = point_systems(m, ns, lines, beam, args.systems)
    for label, (run, *_) in runs.items():  # warm-up on one batch
        if label not in warm:
            run(lines[:batch], beam)
    r = timed_rounds(m, runs, lines, beam, n * args.steps, args, f"{m.name} b{batch} k{beam} t{threads}")
    shape = m.shape
    for label, (_run, key, frac, dtype) in runs.items():
        sec = statistics.median(r.times[label])
        prec = "int8" if dtype == "int8" else "fp32"
        s_full = prof[prec][0] if prec in prof else None
        s_own, u, clustered = None, 1.0, key.startswith("clustered")
        if clustered:
            s_own, u_prof = prof[prec][1][frac]
            u = r.map_union.get(label, statistics.mean(r.union[label]) if r.union[label] else u_prof)
        elif key in ("full-fp32", "full-int8"):
            s_own = s_full
        elif key == "ct2-int8-vmap":
            u = vmap_count[frac] / shape.vocab
        gflops = decode_flops(shape, src_len, n, args.steps, beam, u, args.clusters if clustered else 0)
        gflops /= sec * 1e9
        bound = 1.0 / ((1.0 - s_full) + s_full * u) if s_full is not None and clustered else None
        full_rows = round(statistics.mean(r.full_rows[label]), 4) if r.full_rows[label] else None
        result["rows"].append({
            "shape": m.name, "d_model": shape.d_model, "layers": [shape.enc_layers, shape.dec_layers],
            "ffn": shape.ffn, "vocabulary": shape.vocab, "system": label,
            "engine": "ctranslate2" if key.startswith("ct2") else "fastvocab", "dtype": dtype,
            "active_fraction": frac, "batch": batch, "beam": beam, "threads": threads,
            "parallel": args.parallel, "sentences": n, "steps": args.steps, "src_tokens": src_len,
            "tokens": r.tokens[label], "seconds_median": round(sec, 4),
            "seconds": [round(t, 4) for t in r.times[label]], "tokens_per_s": round(r.tokens[label] / sec, 2),
            "projection_share": _round(s_own, 4), "full_projection_share": _round(s_full, 4),
            "union_fraction": round(u, 5), "full_rows_fraction": full_rows, "bound": _round(bound, 3),
            "gflops": round(gflops, 2), "gemm_peak_gflops": peak, "gemm_peak_share": round(gflops / peak, 4),
            "rss_mib": round(max(r.rss[label])), "rss_run_mib": round(max(r.rss_run[label])),
            "loadavg": round(r.load[0], 2), "loadavg_after": round(r.load_after[0], 2),
        })  # fmt: skip


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=comma_list(str, SHAPES), default=["m2m100-418m"], help=", ".join(SHAPES))
    p.add_argument("--systems", type=comma_list(str, SYSTEMS), default=SYSTEMS, help=", ".join(SYSTEMS))
    p.add_argument("--batch", type=comma_list(int), default=[1, 8, 32])
    p.add_argument("--beam", type=comma_list(int), default=[1, 4])
    p.add_argument("--threads", type=comma_list(int), default=[2, 1])
    p.add_argument(
        "--one-thread-batch", type=comma_list(int),
        help="at 1 thread, only these batches (default: 32 when --threads has several values, else all)",
    )  # fmt: skip
    p.add_argument("--active", type=comma_list(float), default=FRACTIONS, help="active fraction per cluster")
    p.add_argument("--clusters", type=int, default=2000, help="clusters of a synthetic map (r)")
    p.add_argument(
        "--zipf", type=float, default=1.0,
        help="exponent of the synthetic maps' id popularity (default 1; real unions grow a little faster)",
    )  # fmt: skip
    p.add_argument(
        "--inactive-mass", default="none", help="the clustered projection's estimate (default none)"
    )
    p.add_argument("--selection", choices=["union", "per-row"], default="union", help="clustered's")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=48, help="tokens generated per sentence")
    p.add_argument(
        "--sentences", type=int,
        help="lines per run (default: one batch per worker, at least 4 lines a worker)",
    )  # fmt: skip
    p.add_argument("--src-words", type=int, default=16, help="words per source line")
    p.add_argument("--parallel", choices=["workers", "intra"], default="workers")
    p.add_argument(
        "--engine", choices=["static", "onnx"], default="static",
        help="fastvocab's decoder engine (translate --engine; onnx exports the model's layers once, cached)",
    )  # fmt: skip
    p.add_argument("--root", default=str(ROOT / "work" / "model-scale"), help="model, CT2 and map cache")
    p.add_argument("--real-map", default=str(ROOT / "runs" / "demo" / "maps" / "en-it"))
    p.add_argument("--out", help="result JSON (default benchmarks/results/model-scale-cpu-<date>.json)")
    args = p.parse_args(argv)
    if "ct2-int8-vmap" in args.systems and not {"clustered-int8", "clustered-fp32"} & set(args.systems):
        args.systems.append("clustered-int8")  # the vmap's candidate count is clustered's union

    import ctranslate2

    result: dict = {
        "benchmark": "bench_model_scale",
        **provenance("bench_model_scale.py", argv, "decoding", "kernels", "tasks"), "args": vars(args),
        "torch": torch.__version__,
        "int8_gemm": {name: many_rows_gemm(SHAPES[name].d_model) for name in args.shapes},
        "ctranslate2": ctranslate2.__version__,
        "timing": "one process, systems interleaved round by round; tokens/s from the median round",
        "gemm_peak_gflops": {}, "load_avg": {"start": load_avg()},
        "real_map_union_growth": real_union_growth(args.real_map), "shapes": {}, "rows": [],
    }  # fmt: skip
    for name in args.shapes:
        gc.collect()  # the previous shape's models go before this one's memory check
        run_shape(name, args, result)
    result["load_avg"]["end"] = load_avg()
    out = Path(args.out) if args.out else RESULTS / f"model-scale-cpu-{dt.date.today().isoformat()}.json"
    write_result(out, result)
    for r in result["rows"]:
        point = f"{r['shape']} b{r['batch']} k{r['beam']} t{r['threads']} {r['system']}"
        print(
            f"{point}: {r['tokens_per_s']} tok/s, s {r['projection_share']}, u {r['union_fraction']}, "
            f"bound {r['bound']}, {r['gflops']} GF/s, {r['rss_mib']} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

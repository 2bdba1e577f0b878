"""Where a translation's CPU time goes, by library and kernel: fastvocab (``fastvocab.Translator``, its
default CPU engine) and CTranslate2 on the same lines, threads and beam, each in a fresh process whose decode
(the warm-up excluded) runs under ``perf record`` (cpu-clock samples of that process's threads).

    python benchmarks/bench_cpu_kernels.py --out benchmarks/results/cpu-kernels-cpu-DATE.json
    python benchmarks/bench_cpu_kernels.py --emulate no-amx   # the caps of an AVX-512 CPU without AMX

How samples are grouped, how a kernel's ISA is read and what ``--emulate`` sets:
``benchmarks/harnesses.md#bench_cpu_kernelspy``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench_meta import EMULATE, EMULATE_ENV, ROOT, emulate, result_header, write_result

TOP = 12  # the hottest symbols a system's record keeps
# (family, library pattern, symbol pattern): the first match names a sample's family
FAMILIES = [
    ("MLAS int8 GEMM", r"onnxruntime", r"Mlas\w*(U8|S8|Quant|Qgemm|Int8)"),
    ("MLAS fp32 GEMM", r"onnxruntime", r"MlasSgemm|MlasGemmFloat|MlasConv"),
    ("MLAS other", r"onnxruntime", r"Mlas"),
    ("ONNX Runtime other", r"onnxruntime", r""),
    ("fbgemm", r"", r"fbgemm"),
    ("MKL", r"", r"^mkl_"),
    ("oneDNN", r"", r"dnnl|^brg|jit_"),
    ("CTranslate2 other", r"ctranslate2", r""),
    ("OpenMP", r"gomp|iomp", r""),
    ("torch (ATen)", r"torch_cpu|libc10|torch_python", r""),
    ("jit (unnamed)", r"unknown|perf-\d+\.map|JIT", r""),
    ("python", r"python|\.cpython-", r""),
    ("kernel", r"kernel", r""),
]


def family(dso: str, sym: str) -> str:
    for name, lib, pattern in FAMILIES:
        if re.search(lib, dso) and (not pattern or re.search(pattern, sym)):
            return name
    return "other (libc, libm, ...)"


# (ISA, pattern) over a kernel's name or, for code without symbols, its instructions: the first match
ISAS = [
    ("AMX", r"amx|Amx|\btdpb\w+|\btileload"),
    ("AVX-512 VNNI", r"avx512_?vnni|Avx512Vnni|\bvpdpbusds? .*zmm"),
    ("AVX-VNNI", r"AvxVnni|avx_vnni|\{vex\} vpdpbusd"),
    ("AVX-512", r"avx512|Avx512|zmm"),
    ("AVX2", r"avx2|Avx2|AVX2|ymm"),
]


def isa(text: str) -> str | None:
    return next((name for name, pattern in ISAS if re.search(pattern, text)), None)


def code_isa(path: str, addr: int, cache: dict) -> str | None:
    """The ISA of the instructions around ``addr`` in the shared object ``path`` (a symbol-less sample:
    perf names it by address); a window of 48 bytes either side, since a sample lands near, not on, the
    instruction that ran."""
    key = (path, addr >> 4)
    if key not in cache:
        out = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", f"--start-address={max(addr - 48, 0)}",
             f"--stop-address={addr + 48}", path],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        cache[key] = isa("\n".join(line for line in out.splitlines() if re.match(r"\s+[0-9a-f]+:", line)))
    return cache[key]


def perf_profile(path: Path) -> list[tuple[float, str, str]]:
    """``(percent, dso, symbol)`` of every symbol perf saw in ``path``."""
    out = subprocess.run(
        ["perf", "report", "-i", str(path), "--stdio", "--no-children", "--sort", "dso,sym", "-F",
         "overhead,dso,sym", "--percent-limit", "0", "-t", "\t"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("\t")]
        if len(parts) == 3 and parts[0].endswith("%"):
            rows.append((float(parts[0][:-1]), parts[1], re.sub(r"^\[\.\]\s*|^\[k\]\s*", "", parts[2])))
    return rows


def make_system(args):
    """The child's system: a function decoding ``lines`` at ``beam``."""
    kind, dtype, method = args.child.split(":")
    if kind == "fastvocab":
        from fastvocab import Translator

        maps = args.maps if method == "clustered" else None
        tr = Translator(args.model, maps=maps, compute_type=dtype, threads=args.threads)
        return lambda lines, beam: tr.translate_batch(lines, args.src_lang, args.tgt_lang, beam_size=beam)
    from bench_peer import Ct2System, convert_ct2

    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    ct2_dir = Path(args.ct2_dir)
    if not (ct2_dir / "model.bin").exists():
        convert_ct2(Path(args.model), ct2_dir)
    ns = argparse.Namespace(**vars(args), parallel="workers", max_len=128)
    system = Ct2System(ct2_dir, dtype, Seq2SeqAdapter.load(args.model), ns)
    return lambda lines, beam: system(lines, beam)[1]


def child(args) -> int:
    if args.emulate:
        emulate(args.emulate)
    from fastvocab.artifacts_schema.corpus import read_direction

    _, lines, _ = read_direction(args.corpus, args.src_lang, args.tgt_lang, "test", limit=args.n)
    decode = make_system(args)
    decode(lines[: 2 * args.batch_size], args.beam)  # warm-up: compiles, caches, thread pools
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(args.freq), "-p", str(os.getpid()),
         "-o", args.perf_data],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # perf attaches to every thread before the decode starts
    t0 = time.perf_counter()
    out = decode(lines, args.beam)
    wall = time.perf_counter() - t0
    perf.send_signal(signal.SIGINT)
    perf.wait()
    # where each shared object lies, for reading the code of samples without a symbol
    objects = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        where = line.split()[-1]
        if where.startswith("/"):
            objects.setdefault(Path(where).name, where)
    print(json.dumps({"wall_s": round(wall, 3), "lines": len(out), "objects": objects}))
    return 0


def run_system(args, system: str, beam: int, env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        cmd = [sys.executable, __file__, "--child", system, "--beam", str(beam), "--perf-data", str(data)]
        for name in ("model", "maps", "corpus", "src_lang", "tgt_lang", "n", "threads", "batch_size", "freq"):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        cmd += ["--ct2-dir", args.ct2_dir] + (["--emulate", args.emulate] if args.emulate else [])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"bench_cpu_kernels: {system} beam {beam} failed: {done.stderr.strip()[-2000:]}")
        timing = json.loads(done.stdout.strip().splitlines()[-1])
        rows = perf_profile(data)
    objects, cache = timing.pop("objects"), {}
    shares, isas, by_family = Counter(), Counter(), defaultdict(Counter)  # percent by family, ISA, both
    for pct, dso, sym in rows:
        fam = family(dso, sym)
        shares[fam] += pct
        hexed = re.fullmatch(r"0x([0-9a-f]+)", sym)
        if hexed and dso in objects:
            kind = code_isa(objects[dso], int(hexed[1], 16), cache) if pct >= 0.05 else None
        else:
            kind = isa(sym)
        kind = kind or "scalar, SSE or not known"
        isas[kind] += pct
        by_family[fam][kind] += pct
    top = sorted(rows, reverse=True)[:TOP]
    return {
        "system": system, "beam": beam, **timing, "families_pct": _rounded(shares), "isa_pct": _rounded(isas),
        "isa_pct_by_family": {f: _rounded(v) for f, v in by_family.items()},
        "top_symbols": [{"pct": p, "dso": d, "symbol": s[:160]} for p, d, s in top],
    }  # fmt: skip


def _rounded(shares: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models/demo"))
    ap.add_argument("--maps", default=str(ROOT / "models/demo-maps"))
    ap.add_argument("--corpus", default=str(ROOT / "data/corpus"))
    ap.add_argument("--ct2-dir", default=tempfile.gettempdir() + "/fastvocab-ct2-demo")
    ap.add_argument("--src-lang", default="en")
    ap.add_argument("--tgt-lang", default="it")
    ap.add_argument("--n", type=int, default=200, help="test lines decoded under perf (default: 200)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--beams", default="1,4")
    ap.add_argument(
        "--systems", default="fastvocab:int8:clustered,ct2:int8:full,fastvocab:float32:full,ct2:float32:full"
    )
    ap.add_argument("--emulate", choices=sorted(EMULATE), help="run under another CPU family's ISA caps")
    ap.add_argument("--freq", type=int, default=999, help="samples a second a thread (default: 999)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--perf-data", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    env = {**os.environ, "ONEDNN_JIT_PROFILE": "2"}  # the children emulate for themselves, before loading
    if args.emulate:
        os.environ[EMULATE_ENV] = args.emulate  # what result_header records
    beams, systems = args.beams.split(","), args.systems.split(",")
    runs = [run_system(args, system, int(beam), env) for beam in beams for system in systems]
    for r in runs:
        fams = ", ".join(f"{k} {v:.0f}%" for k, v in list(r["families_pct"].items())[:6])
        isas = ", ".join(f"{k} {v:.0f}%" for k, v in list(r["isa_pct"].items())[:4])
        print(f"{r['system']:28s} beam {r['beam']}  {r['wall_s']:6.2f} s  {fams}\n{'':38s}ISA: {isas}")
    result = {
        **result_header("cpu_kernels"),
        "lines": f"{args.corpus} {args.src_lang}-{args.tgt_lang} test, first {args.n}",
        "threads": args.threads, "batch_size": args.batch_size, "runs": runs,
    }  # fmt: skip
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

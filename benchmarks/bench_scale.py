"""Scale: corpus ingestion of generated files of millions of lines in bounded memory.

    .venv/bin/python benchmarks/bench_scale.py --lines 2000000,20000000
    .venv/bin/python benchmarks/bench_scale.py --lines 0 --translate 2000,8000 --tag translate
    .venv/bin/python benchmarks/bench_scale.py --lines 0 --plan 2000000,20000000 --tag plan
    .venv/bin/python benchmarks/bench_scale.py --lines 0 --translate-resume 1000000 --tag translate-1m
    .venv/bin/python benchmarks/bench_scale.py --lines 0 --dump-workers 1,2 --tag dump-scaling

With ``--plan``, the dump stage's planner (``pipeline.stages.dump.dump_specs``: shards as row ranges of the
corpus file, each range's digest streamed) runs in a fresh process on a generated monolingual corpus file of
that many lines, recording its peak RSS and time; up to ``--plan-old-upto`` lines, what the planner held
before (the sample read into lists) is measured beside it.

With ``--translate-resume N``, ``fastvocab translate`` (the tests' tiny fixture model unless ``--model``,
greedy, ``--max-len 8``, batch 64, 1 thread, ``--chunk-lines 10000``) runs on N generated lines, is SIGKILLed
once half the chunks are done, and is run again to the end: RSS sampled every 2 s in both runs, the parts of
the first run that the second rewrote (none expected), and the order (chunks translated on their own equal
their lines of the output).

With ``--dump-workers 1,2``, ``fastvocab run --stages dump`` (demo model, local Ray, 1 torch thread a
worker) runs on the same slice with each worker count, interleaved ``--dump-repeats`` times.

With ``--translate``, ``fastvocab translate`` (demo model, full softmax, greedy, ``--max-len 32``,
``--chunk-lines 1000``, 1 thread) runs on text files of that many lines (the en-it test split of
``data/corpus`` repeated), recording peak RSS and lines/s: memory is flat in the line count when the input
streams in chunks.

For each size it generates a monolingual text file and a parallel TSV file of that many lines (synthetic
sentences over a 5,000-word vocabulary, ~2% repeated lines, 1% empty lines in the monolingual file), then
runs, each in a fresh process, ``fastvocab corpus --mono`` and ``fastvocab corpus --from-tsv`` and records
the wall time, lines/s and peak RSS (``ru_maxrss`` of the child). Bounded memory means the peak grows with
the line count only by the de-duplication index (about 9 bytes a line for --mono, 17 for --from-tsv, plus
``np.unique``'s sort), never by the text. Writes ``benchmarks/results/scale-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_meta import cpu_name, proc_status, wait_child

from fastvocab.artifacts_schema.provenance import git_commit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FASTVOCAB = Path(sys.executable).parent / "fastvocab"


def generate(path: Path, lines: int, *, parallel: bool, seed: int = 0) -> None:
    """Synthetic sentences written in blocks (the generator's own memory stays small)."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(5000)])
    block = 200_000
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, lines, block):
            n = min(block, lines - start)
            lengths = rng.integers(4, 16, size=n)
            ids = rng.integers(0, len(words), size=int(lengths.sum()))
            cuts = np.cumsum(lengths)[:-1]
            sents = [" ".join(s) for s in np.split(words[ids], cuts)]
            repeat = rng.random(n) < 0.02  # a repeated line: the previous one again
            for i in np.flatnonzero(repeat[1:]) + 1:
                sents[i] = sents[i - 1]
            if parallel:
                out = [f"{s}\tT {s}" for s in sents]
            else:
                empty = rng.random(n) < 0.01
                out = ["" if e else s for s, e in zip(sents, empty, strict=True)]
            f.write("\n".join(out) + "\n")


def run_child(argv: list[str]) -> dict[str, float]:
    """Run a command to completion: its wall time and its own peak RSS (``wait4`` reports that child's)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    code, peak = wait_child(proc)
    seconds = time.perf_counter() - t0
    if code:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr.read().decode() if proc.stderr else ''}")
    return {"seconds": round(seconds, 2), "peak_rss_mb": peak}


def translate_rows(sizes: list[int], workdir: str | None) -> list[dict]:
    from fastvocab.artifacts_schema.corpus import read_direction

    _, sources, _ = read_direction(ROOT / "data" / "corpus", "en", "it", "test")
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for n in sizes:
            src = Path(tmp) / f"in-{n}.txt"
            src.write_text("".join(sources[i % len(sources)] + "\n" for i in range(n)), encoding="utf-8")
            out = Path(tmp) / f"out-{n}.txt"
            argv = [str(FASTVOCAB), "translate", "--model", str(ROOT / "models" / "demo"), "--src-lang", "en",
                    "--tgt-lang", "it", "-i", str(src), "-o", str(out), "--max-len", "32",
                    "--chunk-lines", "1000", "--threads", "1", "--no-progress"]  # fmt: skip
            res = run_child(argv)
            row = {
                "command": " ".join(["fastvocab", *argv[1:]])
                .replace(tmp, "$TMP")
                .replace(str(ROOT) + "/", ""),
                "kind": "translate",
                "lines": n,
                **res,
                "lines_per_second": round(n / res["seconds"], 1),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def build_tiny_model(root: Path) -> Path:
    """The tests' tiny fixture model (random weights, d=32, vocabulary ~300), saved under ``root``."""
    import torch
    from transformers import M2M100ForConditionalGeneration

    from fastvocab.training.demo_model import build_tokenizer, model_config, train_sentencepiece

    sys.path.insert(0, str(ROOT))
    from tests.conftest import LANGS, TINY_ARCH, synthetic_sentences

    texts = [s for lang in LANGS for s in synthetic_sentences(lang, 300)]
    spm = train_sentencepiece(texts, TINY_ARCH["vocab"], root / "spm", threads=1)
    out = root / "model"
    tok = build_tokenizer(spm, LANGS, out)
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(model_config(TINY_ARCH, tok, max_positions=128)).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def watch(argv: list[str], parts: Path, kill_after_parts: int | None, every: float = 2.0) -> dict:
    """Run ``argv``, sampling its RSS and the finished parts every ``every`` s; SIGKILL it once
    ``kill_after_parts`` parts exist. Returns timings, the RSS series and the parts seen (name -> mtimes)."""
    import contextlib
    import signal

    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    samples, seen, hwm, killed = [], {}, 0, False
    while proc.poll() is None:
        time.sleep(every)
        vm = proc_status(proc.pid)
        files = sorted(parts.glob("part-*.parquet")) if parts.is_dir() else []
        for f in files:
            # the parts folder is removed once the output is assembled
            with contextlib.suppress(FileNotFoundError):
                seen.setdefault(f.name, set()).add(f.stat().st_mtime_ns)
        if vm:
            hwm = max(hwm, vm.get("VmHWM", 0))
            samples.append([round(time.perf_counter() - t0, 1), round(vm["VmRSS"] / 1024, 1), len(files)])
        if kill_after_parts is not None and len(files) >= kill_after_parts and not killed:
            proc.send_signal(signal.SIGKILL)
            killed = True
    out = proc.stdout.read().decode() if proc.stdout else ""
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "returncode": proc.returncode,
        "killed": killed,
        "peak_rss_mb": round(hwm / 1024, 1),  # VmHWM at the last sample
        "rss_samples": samples,  # [seconds, RSS MB, finished parts on disk]
        "parts_seen": {k: sorted(v) for k, v in seen.items()},
        "output_tail": out[-2000:],
    }


def translate_resume(n: int, workdir: str | None, model: str | None, max_len: int, chunk_lines: int) -> dict:
    """``fastvocab translate`` on ``n`` lines, SIGKILLed once half the chunks are done, then rerun to the end.

    Records RSS sampled over time in both runs, which finished parts the second run rewrote (none expected),
    and checks the order: a few chunks are translated again on their own and must equal their lines of the
    output.
    """
    sys.path.insert(0, str(ROOT))
    from tests.conftest import synthetic_sentences

    tmp = Path(tempfile.mkdtemp(dir=workdir, prefix="translate-resume-"))
    model_dir = Path(model) if model else build_tiny_model(tmp / "tiny")
    src = tmp / f"in-{n}.txt"
    t0 = time.perf_counter()
    with src.open("w", encoding="utf-8") as f:
        for start in range(0, n, 100_000):
            block = synthetic_sentences("en", min(100_000, n - start), seed=start)
            f.write("".join(s + "\n" for s in block))
    gen = time.perf_counter() - t0
    out = tmp / f"out-{n}.txt"
    parts = out.with_name(out.name + ".parts")
    base = [str(FASTVOCAB), "translate", "--model", str(model_dir), "--src-lang", "en", "--tgt-lang", "it",
            "--max-len", str(max_len), "--batch-size", "64", "--threads", "1", "--no-progress"]  # fmt: skip
    argv = [*base, "-i", str(src), "-o", str(out), "--chunk-lines", str(chunk_lines)]
    chunks = -(-n // chunk_lines)
    first = watch(argv, parts, kill_after_parts=chunks // 2)
    done_before = {f.name: f.stat().st_mtime_ns for f in parts.glob("part-*.parquet")}
    second = watch(argv, parts, kill_after_parts=None)
    # a part of the first run that the second run wrote again shows another mtime
    rewritten = sorted(
        k for k, v in second["parts_seen"].items() if k in done_before and v != [done_before[k]]
    )
    with out.open(encoding="utf-8") as f:
        hyps = f.read().split("\n")[:-1]
    lines = src.read_text(encoding="utf-8").split("\n")[:-1]
    # order: chunks (first, last before the kill, first after it, last) translated alone equal the output
    killed_at = len(done_before)
    order = {}
    for c in sorted({0, max(killed_at - 1, 0), min(killed_at, chunks - 1), chunks - 1}):
        lo, hi = c * chunk_lines, min((c + 1) * chunk_lines, n)
        one_in, one_out = tmp / f"chunk-{c}.txt", tmp / f"chunk-{c}.out.txt"
        one_in.write_text("".join(x + "\n" for x in lines[lo:hi]), encoding="utf-8")
        run_child([*base, "-i", str(one_in), "-o", str(one_out), "--chunk-lines", str(chunk_lines)])
        order[c] = one_out.read_text(encoding="utf-8").split("\n")[:-1] == hyps[lo:hi]
    rss1 = [s[1] for s in first["rss_samples"]]
    rss2 = [s[1] for s in second["rss_samples"]]
    translated_2 = n - killed_at * chunk_lines
    row = {
        "kind": "translate-kill-resume",
        "lines": n,
        "chunk_lines": chunk_lines,
        "chunks": chunks,
        "model": "tests' tiny fixture model (random weights, d=32, 2+2 layers, vocab ~300)"
        if not model
        else str(model_dir).replace(str(ROOT) + "/", ""),
        "command": " ".join(["fastvocab", *argv[1:]]).replace(str(tmp), "$TMP"),
        "generate_seconds": round(gen, 1),
        "first_run": {
            "seconds": first["seconds"],
            "sigkill_after_parts": chunks // 2,
            "parts_finished_at_kill": killed_at,
            "returncode": first["returncode"],
            "peak_rss_mb": first["peak_rss_mb"],
            "rss_mb_min_max_sampled": [min(rss1, default=None), max(rss1, default=None)],
            "lines_per_second": round(killed_at * chunk_lines / first["seconds"], 1),
        },
        "resume_run": {
            "seconds": second["seconds"],
            "returncode": second["returncode"],
            "parts_reused": killed_at,
            "parts_from_first_run_rewritten": rewritten,
            "lines_translated": translated_2,
            "lines_per_second": round(translated_2 / second["seconds"], 1),
            "peak_rss_mb": second["peak_rss_mb"],
            "rss_mb_min_max_sampled": [min(rss2, default=None), max(rss2, default=None)],
            "output_tail": second["output_tail"][-600:],
        },
        "output_lines": len(hyps),
        "output_lines_equal_input_lines": len(hyps) == n,
        "order_check_chunks_equal_when_translated_alone": order,
        "rss_samples_first_run": first["rss_samples"][::5],
        "rss_samples_resume_run": second["rss_samples"][::5],
    }
    print(json.dumps({k: v for k, v in row.items() if not k.startswith("rss_samples")}), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def write_mono_parquet(path: Path, lines: int, seed: int = 0) -> None:
    """A monolingual corpus file as ``fastvocab corpus --mono`` writes it (``id, text``, row groups of
    100,000), of generated sentences: the dump planner's input without the import's time."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from fastvocab.artifacts_schema.corpus import MONO_SCHEMA

    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(5000)])
    block = 100_000
    lengths = rng.integers(4, 16, size=block)
    pool = pa.array(
        [
            " ".join(s)
            for s in np.split(words[rng.integers(0, 5000, int(lengths.sum()))], np.cumsum(lengths)[:-1])
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, MONO_SCHEMA) as writer:
        for start in range(0, lines, block):
            n = min(block, lines - start)
            ids = pa.array(np.arange(start + 1, start + n + 1, dtype=np.int64))
            # a pool of sentences made unique by their line number (Arrow: no Python string per line)
            texts = pc.binary_join_element_wise(pc.cast(ids, pa.string()), pool.slice(0, n), " ")
            writer.write_table(pa.table([ids, texts], schema=MONO_SCHEMA))


# The planner as the dump stage calls it, in a fresh process: RSS after the imports, then peak (wait4).
PLAN_CHILD = """
import json, resource, sys, time
from fastvocab.pipeline.config import load_config
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.stages.dump import dump_specs
corpus, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
if mode == "rows":
    cfg = load_config(None, {"corpus.out_dir": corpus, "directions": ["it-en"], "dump.sources": ["mono"],
                             "dump.sentences": n, "dump.stream_sentences": 0, "dump.shard_sentences": 500})
    specs = dump_specs(StageContext(cfg, ray=None, progress=False), "it-en")
    out = {"shards": len(specs), "sentences": sum(s.sentences for s in specs)}
else:  # what the planner did before row ranges: the sample's ids and texts as Python lists
    from fastvocab.artifacts_schema.corpus import read_mono
    ids, texts = read_mono(corpus, "it", limit=n)
    ids, texts = list(ids), list(texts)
    out = {"sentences": len(texts)}
out.update(seconds=round(time.perf_counter() - t0, 2), rss_after_imports_mb=round(base, 1))
print(json.dumps(out))
"""


def plan_rows(sizes: list[int], workdir: str | None, old_upto: int) -> list[dict]:
    """Peak RSS and time of the dump planner on generated monolingual files of ``sizes`` lines (and of the
    old in-memory sample for sizes up to ``old_upto``)."""
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for n in sizes:
            corpus = Path(tmp) / "corpus"
            t0 = time.perf_counter()
            write_mono_parquet(corpus / "mono" / "it.parquet", n)
            gen = time.perf_counter() - t0
            for mode in ("rows", "in-memory-sample") if n <= old_upto else ("rows",):
                argv = [sys.executable, "-c", PLAN_CHILD, str(corpus), str(n), mode]
                t0 = time.perf_counter()
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                code, peak = wait_child(proc)
                if code:
                    raise SystemExit(f"planner child failed:\n{proc.stderr.read().decode()}")
                child = json.loads(proc.stdout.read().decode().strip().splitlines()[-1])
                row = {
                    "kind": "dump-plan" if mode == "rows" else "dump-plan-old-in-memory-sample",
                    "what": "pipeline.stages.dump.dump_specs (row ranges, digests streamed)"
                    if mode == "rows"
                    else "read_mono + list(): the sample the planner held before row ranges",
                    "lines": n,
                    "file_mb": round((corpus / "mono" / "it.parquet").stat().st_size / 2**20, 1),
                    "generate_seconds": round(gen, 1),
                    **child,
                    "process_seconds": round(time.perf_counter() - t0, 2),
                    "peak_rss_mb": peak,
                }
                if mode == "rows":
                    row["lines_per_second"] = round(n / child["seconds"])
                print(json.dumps(row), flush=True)
                rows.append(row)
            (corpus / "mono" / "it.parquet").unlink()
    return rows


# One `fastvocab run --stages dump` in a fresh process (fresh local Ray), its dump record's metrics as JSON.
DUMP_CHILD = """
import json, sys, time
from fastvocab.pipeline.config import load_config
from fastvocab.pipeline.run import run_pipeline
from fastvocab.pipeline.tracking import NullTracker
t0 = time.perf_counter()
res = run_pipeline(load_config(sys.argv[1]), stages=["dump"], tracker=NullTracker(), progress=False,
                   log_to_driver=False)
(rec,) = [r for r in res.records if r.stage == "dump"]
print(json.dumps({"status": rec.status, "metrics": rec.metrics, "process_pipeline_seconds":
                  round(time.perf_counter() - t0, 2)}))
"""


def dump_scaling(workers: list[int], repeats: int, sentences: int, shard: int, max_len: int, workdir) -> dict:
    """The dump stage (local Ray, demo model, en-it train split, 1 torch thread a worker) with each worker
    count, interleaved ``repeats`` times, each run from an empty work dir: states/s of the stage (states over
    the stage's wall time, actor start and model load included) and per worker (states over decode time)."""
    import yaml

    runs = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for rep in range(repeats):
            for w in workers:
                work = Path(tmp) / f"w{w}-r{rep}"
                cfg = {
                    "work_dir": str(work),
                    "model": str(ROOT / "models" / "demo"),
                    "directions": ["en-it"],
                    "corpus": {"out_dir": str(ROOT / "data" / "corpus")},
                    "ray_num_cpus": os.cpu_count(),
                    "dump": {
                        "sentences": sentences,
                        "stream_sentences": 0,
                        "shard_sentences": shard,
                        "max_len": max_len,
                        "batch_size": 32,
                        "num_workers": w,
                        "torch_threads": 1,
                    },
                }
                path = Path(tmp) / f"w{w}-r{rep}.yaml"
                path.write_text(yaml.safe_dump(cfg))
                load = os.getloadavg()
                proc = subprocess.run(
                    [sys.executable, "-c", DUMP_CHILD, str(path)], capture_output=True, text=True, check=False
                )
                if proc.returncode:
                    raise SystemExit(f"dump run failed:\n{proc.stderr[-3000:]}")
                child = json.loads(proc.stdout.strip().splitlines()[-1])
                m = child["metrics"]
                run = {
                    "workers": w,
                    "repeat": rep,
                    "states": m["states_dumped"],
                    "shards": m["shards_written"],
                    "stage_wall_seconds": round(m["stage_wall_seconds"], 2),
                    "decode_seconds_all_workers": round(m["decode_seconds"], 2),
                    "states_per_s_stage": round(m["states_dumped"] / m["stage_wall_seconds"], 1),
                    "states_per_s_per_worker": round(m["states_per_s_per_worker"], 1),
                    "load_average_before": load,
                }
                print(json.dumps(run), flush=True)
                runs.append(run)
                shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for w in workers:
        mine = [r for r in runs if r["workers"] == w]
        summary[str(w)] = {
            "states_per_s_stage_median": float(np.median([r["states_per_s_stage"] for r in mine])),
            "states_per_s_per_worker_median": float(np.median([r["states_per_s_per_worker"] for r in mine])),
        }
    base = summary[str(workers[0])]["states_per_s_stage_median"]
    for w in workers:
        summary[str(w)]["speedup_vs_first"] = round(summary[str(w)]["states_per_s_stage_median"] / base, 3)
    return {
        "kind": "dump-scaling",
        "model": "models/demo",
        "slice": f"en-it train split, first {sentences} sentences, shards of {shard}, max_len {max_len}, "
        "batch 32, greedy, 1 torch thread a worker, local Ray",
        "runs": runs,
        "summary": summary,
    }


# `fastvocab run --stages dump,kmeans,maps` in this process, the driver's peak RSS sampled by the parent.
STREAM_CHILD = """
import json, sys, time
from fastvocab.pipeline.config import load_config
from fastvocab.pipeline.run import run_pipeline
from fastvocab.pipeline.tracking import NullTracker
t0 = time.perf_counter()
res = run_pipeline(load_config(sys.argv[1]), stages=["dump", "kmeans", "maps"], tracker=NullTracker(),
                   progress=False, log_to_driver=False)
out = {r.stage: {"status": r.status, "metrics": r.metrics} for r in res.records}
out["seconds"] = round(time.perf_counter() - t0, 2)
print(json.dumps(out))
"""


def dump_stream(sizes: list[int], stored: int, max_len: int, workdir: str | None) -> list[dict]:
    """The dump with streaming (``dump.sentences`` stored, ``dump.stream_sentences: all``) over generated
    monolingual inputs of ``sizes`` lines, tiny fixture model, greedy, local Ray with 2 workers: the driver
    process's peak RSS (VmHWM, sampled; the Ray workers are other processes), the stored states and the
    states counted into the maps, each size from an empty work dir."""
    import yaml

    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        for n in sizes:
            corpus = Path(tmp) / f"corpus-{n}"
            write_mono_parquet(corpus / "mono" / "it.parquet", n)
            cfg = {
                "work_dir": str(Path(tmp) / f"work-{n}"),
                "model": str(model),
                "directions": ["it-en"],
                "corpus": {"out_dir": str(corpus)},
                "ray_num_cpus": 2,
                "dump": {
                    "sources": ["mono"],
                    "sentences": stored,
                    "stream_sentences": "all",
                    "shard_sentences": 20_000,
                    "max_len": max_len,
                    "batch_size": 64,
                    "k": 2,
                    "num_workers": 2,
                    "torch_threads": 1,
                },
                "kmeans": {"r": 32, "niter": 5},
            }
            path = Path(tmp) / f"stream-{n}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            res = watch([sys.executable, "-c", STREAM_CHILD, str(path)], Path(tmp) / "none", None, every=0.5)
            if res["returncode"]:
                raise SystemExit(f"streamed dump of {n} lines failed:\n{res['output_tail']}")
            child = json.loads([ln for ln in res["output_tail"].splitlines() if ln.startswith("{")][-1])
            dump, maps = child["dump"]["metrics"], child["maps"]["metrics"]
            row = {
                "kind": "dump-stream",
                "lines": n,
                "stored_sentences": stored,
                "stored_states": dump["states"],
                "states_counted": maps["states_used"],
                "streamed_states": maps["streamed_states"],
                "driver_peak_rss_mb": res["peak_rss_mb"],
                "seconds": child["seconds"],
                "max_len": max_len,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
            shutil.rmtree(Path(tmp) / f"work-{n}", ignore_errors=True)
            shutil.rmtree(corpus, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", default="2000000,20000000", help="comma-separated line counts")
    parser.add_argument("--workdir", default=None, help="where the generated files go (default: a temp dir)")
    parser.add_argument("--tag", default="", help="suffix of the result file name")
    parser.add_argument("--note", default="", help="free text for the meta (e.g. other jobs running)")
    parser.add_argument("--translate", default="", help="comma-separated line counts for fastvocab translate")
    parser.add_argument(
        "--translate-resume",
        type=int,
        default=0,
        help="lines for a translate run SIGKILLed half-way and resumed (tiny fixture model unless --model)",
    )
    parser.add_argument("--plan", default="", help="comma-separated line counts for the dump planner")
    parser.add_argument(
        "--plan-old-upto", type=int, default=2_000_000, help="--plan: also the old in-memory sample up to N"
    )
    parser.add_argument("--dump-workers", default="", help="comma-separated dump.num_workers to compare")
    parser.add_argument("--dump-repeats", type=int, default=2, help="--dump-workers: interleaved rounds")
    parser.add_argument("--dump-sentences", type=int, default=256, help="--dump-workers: sentences dumped")
    parser.add_argument("--dump-shard", type=int, default=32, help="--dump-workers: sentences a shard")
    parser.add_argument("--dump-max-len", type=int, default=128, help="--dump-workers: max target tokens")
    parser.add_argument(
        "--dump-stream",
        default="",
        help="comma-separated input lines for the streamed dump (driver's memory)",
    )
    parser.add_argument("--stream-stored", type=int, default=2000, help="--dump-stream: sentences stored")
    parser.add_argument("--stream-max-len", type=int, default=4, help="--dump-stream: max target tokens")
    parser.add_argument("--model", default=None, help="--translate-resume: model folder")
    parser.add_argument("--max-len", type=int, default=8, help="--translate-resume: max target tokens")
    parser.add_argument("--chunk-lines", type=int, default=10_000, help="--translate-resume: lines a chunk")
    args = parser.parse_args()
    sizes = [int(x) for x in args.lines.split(",") if int(x) > 0]
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        for n in sizes:
            for kind in ("mono", "tsv"):
                src = tmp / f"{kind}-{n}.txt"
                t0 = time.perf_counter()
                generate(src, n, parallel=kind == "tsv")
                gen = time.perf_counter() - t0
                out = tmp / f"corpus-{kind}-{n}"
                argv = [str(FASTVOCAB), "corpus", "--output", str(out)]
                if kind == "mono":
                    argv += ["--mono", str(src), "--lang", "it"]
                else:
                    argv += ["--from-tsv", str(src), "--src-lang", "de", "--tgt-lang", "fr"]
                res = run_child(argv)
                manifest = json.loads((out / "corpus.json").read_text())
                record = manifest["mono"]["it"] if kind == "mono" else manifest["pairs"]["de-fr"]
                row = {
                    "command": f"fastvocab corpus {' '.join(argv[2:])}".replace(str(tmp), "$TMP"),
                    "kind": kind,
                    "lines": n,
                    "file_mb": round(src.stat().st_size / 2**20, 1),
                    "generate_seconds": round(gen, 1),
                    **res,
                    "lines_per_second": round(n / res["seconds"]),
                    "written": record["count"] if kind == "mono" else record["counts"],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
                src.unlink()
    if args.translate:
        rows += translate_rows([int(x) for x in args.translate.split(",")], args.workdir)
    if args.dump_workers:
        workers = [int(x) for x in args.dump_workers.split(",")]
        rows.append(
            dump_scaling(
                workers,
                args.dump_repeats,
                args.dump_sentences,
                args.dump_shard,
                args.dump_max_len,
                args.workdir,
            )
        )
    if args.plan:
        rows += plan_rows([int(x) for x in args.plan.split(",")], args.workdir, args.plan_old_upto)
    if args.dump_stream:
        sizes = [int(x) for x in args.dump_stream.split(",")]
        rows += dump_stream(sizes, args.stream_stored, args.stream_max_len, args.workdir)
    if args.translate_resume:
        rows.append(
            translate_resume(args.translate_resume, args.workdir, args.model, args.max_len, args.chunk_lines)
        )
    import torch

    meta = {
        "commit": git_commit("tasks", "artifacts_schema", "pipeline", cwd=ROOT),
        "device": "cpu",
        "torch": torch.__version__,
        "load_average_start": load_start,
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "date": dt.date.today().isoformat(),
        "load_average": os.getloadavg(),
        "command": " ".join([".venv/bin/python", "benchmarks/bench_scale.py", *sys.argv[1:]]),
        **({"note": args.note} if args.note else {}),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"scale-{meta['date']}{'-' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

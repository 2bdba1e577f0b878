"""The bulk job as Ray Data (``read_parquet -> map_batches(actor pool) -> write_parquet`` with Ray Data's
row-id checkpoints, ``ray.data.checkpoint.CheckpointConfig``) against fastvocab's row-range parts driver
(``pipeline/bulk_driver.py``), on the same lines, workers and model.

Two questions, one record:

1. throughput: each way translates the whole input on ``--workers`` actors of one CPU each, in one local Ray
   session (started once, not timed), alternating, ``--rounds`` rounds; the wall time of each job;
2. resumption: each way runs in a subprocess that is killed (SIGKILL) once ``--kill-after`` of the input's
   lines are decoded or written, then reruns; the record says how many lines the rerun translated (the
   lines its workers decoded, as they count them) and whether the final output holds every line once, in
   any order, with the same translations as an uninterrupted run.

    .venv/bin/python benchmarks/bench_ray_data.py --lines 600 --workers 2 \
        --out benchmarks/results/ray-data-cpu-DATE.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from bench_meta import ROOT, result_header, write_result

MODEL = ROOT / "models" / "demo"


class Translator:
    """A Ray Data actor: the demo model and full softmax loaded once; each batch's lines translated. Every
    decoded line is counted in ``FASTVOCAB_PROBE_COUNTS`` (one file per actor), so a rerun's work is known."""

    def __init__(self) -> None:
        import torch

        from fastvocab.decoding import Seq2SeqAdapter
        from fastvocab.tasks.projections import make_projection

        torch.set_num_threads(1)
        self.adapter = Seq2SeqAdapter.load(MODEL)
        self.projection = make_projection(self.adapter, "full")
        self.counts = Path(os.environ["FASTVOCAB_PROBE_COUNTS"]) / f"{os.getpid()}.txt"

    def __call__(self, batch: dict) -> dict:
        from fastvocab.tasks.translate import translate

        lines = [str(t) for t in batch["text"]]
        res = translate(self.adapter, self.projection, lines, "en", "it", progress=False, workers=1)
        with self.counts.open("a") as f:
            f.write(f"{len(lines)}\n")
        return {"id": batch["id"], "translation": res.hypotheses}


def ray_data_job(inp: Path, out: Path, checkpoints: Path, workers: int, batch: int) -> None:
    import ray
    from ray.data.checkpoint import CheckpointConfig

    ctx = ray.data.DataContext.get_current()
    ctx.checkpoint_config = CheckpointConfig(id_column="id", checkpoint_path=str(checkpoints))
    ds = ray.data.read_parquet(str(inp))
    ds = ds.map_batches(Translator, batch_size=batch, concurrency=workers, num_cpus=1)
    ds.write_parquet(str(out))


def parts_job(inp: Path, out: Path, workers: int, batch: int, ray_session=None) -> int:
    """The parts driver's job; returns the lines it decoded (the parts a rerun found done are not)."""
    from fastvocab.decoding.settings import SearchSettings
    from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk

    request = BulkRequest(
        str(inp),
        str(out) + "/",
        MODEL,
        "en",
        "it",
        search=SearchSettings(batch_size=batch),
        workers=workers,
        lines_per_part=batch,
    )
    return run_bulk(request, ray=ray_session, progress=False).sentences


def decoded_lines(counts: Path) -> int:
    return sum(int(x) for f in counts.glob("*.txt") for x in f.read_text().split())


def written(out: Path) -> dict[int, str]:
    """id -> translation of every row in the output folder's Parquet files."""
    rows: dict[int, str] = {}
    for f in sorted(out.glob("*.parquet")):
        t = pq.read_table(f)
        col = "translation" if "translation" in t.column_names else "hypothesis"
        for i, h in zip(t["id"].to_pylist(), t[col].to_pylist(), strict=True):
            rows[int(i)] = h
    return rows


def child(args: argparse.Namespace) -> None:
    """One job in this process (what the kill test runs and kills)."""
    import ray

    ray.init(
        num_cpus=args.workers + 1,  # Ray Data's read and write tasks need a CPU beside the actors'
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=os.environ["FASTVOCAB_PROBE_RAY_TMP"],
    )
    if args.child == "ray-data":
        ray_data_job(args.input, args.output, args.output.parent / "checkpoints", args.workers, args.batch)
    else:
        from fastvocab.pipeline.ray_session import RaySession

        decoded = parts_job(
            args.input, args.output, args.workers, args.batch, RaySession("local", args.workers)
        )
        (Path(os.environ["FASTVOCAB_PROBE_COUNTS"]) / "driver.txt").write_text(f"{decoded}\n")


def kill_session(temp_dir: str) -> None:
    """SIGKILL every process of the Ray session under ``temp_dir`` and their descendants (its GCS and
    raylet name the folder on their command lines; other Ray sessions on the machine are left alone)."""
    parent, cmd = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, IndexError):
            continue
    doomed = {pid for pid, c in cmd.items() if temp_dir.encode() in c} - {os.getpid()}
    while more := {pid for pid, ppid in parent.items() if ppid in doomed} - doomed:
        doomed |= more
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def killed_and_rerun(way: str, inp: Path, root: Path, lines: int, args: argparse.Namespace) -> dict:
    out, counts = root / way / "out", root / way / "counts"
    counts.mkdir(parents=True)
    temp_dir = tempfile.mkdtemp(prefix="fvrd", dir="/tmp")  # short: Ray's socket paths live under it
    env = {
        **os.environ,
        "FASTVOCAB_PROBE_COUNTS": str(counts),
        "RAY_AUTH_MODE": "disabled",
        "FASTVOCAB_PROBE_RAY_TMP": temp_dir,
    }
    argv = [sys.executable, __file__, "--child", way, "--input", str(inp), "--output", str(out)]
    argv += ["--workers", str(args.workers), "--batch", str(args.batch)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        # Ray Data writes its files as its blocks finish, the parts driver a part at a time: either counts
        if max(decoded_lines(counts), len(written(out))) >= args.kill_after * lines:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kill_session(temp_dir)  # the killed driver's Ray: its GCS, raylet and workers
    before, done_before = decoded_lines(counts), len(written(out))
    for f in counts.glob("*.txt"):
        f.unlink()
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rerun_s = time.perf_counter() - t0
    final = written(out)
    return {
        "lines_written_before_kill": done_before,
        "lines_decoded_before_kill": before,
        "lines_decoded_by_rerun": decoded_lines(counts),
        "rerun_s": round(rerun_s, 2),
        "final_lines": len(final),
        "final_complete": sorted(final) == list(range(lines)),
        "final": final,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=600)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="lines a batch, and a part (default: 32)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kill-after", type=float, default=0.5, help="share of lines written before the kill")
    p.add_argument("--out", type=Path)
    p.add_argument("--child", choices=("ray-data", "parts"), help=argparse.SUPPRESS)
    p.add_argument("--input", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    import ray

    from fastvocab.artifacts_schema.corpus import read_direction
    from fastvocab.pipeline.ray_session import RaySession

    _, src, _ = read_direction(ROOT / "data" / "corpus", "en", "it", "train", limit=args.lines)
    with tempfile.TemporaryDirectory(prefix="fastvocab-ray-data-") as tmp:
        root = Path(tmp)
        inp = root / "input"
        inp.mkdir()
        for lo in range(0, len(src), args.batch):  # a file a batch: Ray Data reads (and writes) a block each
            ids = list(range(lo, min(lo + args.batch, len(src))))
            pq.write_table(
                pa.table({"id": ids, "text": src[lo : lo + args.batch]}), inp / f"in-{lo:06d}.parquet"
            )
        counts = root / "counts"
        counts.mkdir()
        os.environ["FASTVOCAB_PROBE_COUNTS"] = str(counts)
        os.environ["RAY_AUTH_MODE"] = "disabled"
        # Ray Data's read and write tasks need a CPU beside the actors' (with as many CPUs as actors it waits)
        ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=False)
        session = RaySession("local", args.workers)
        times: dict[str, list[float]] = {"ray-data": [], "parts": []}
        for r in range(args.rounds):
            for way in ("ray-data", "parts") if r % 2 == 0 else ("parts", "ray-data"):
                out = root / f"{way}-{r}"
                t0 = time.perf_counter()
                if way == "ray-data":
                    ray_data_job(inp, out, root / f"ckpt-{r}", args.workers, args.batch)
                else:
                    parts_job(inp, out, args.workers, args.batch, session)
                times[way].append(round(time.perf_counter() - t0, 2))
                print(f"round {r} {way}: {times[way][-1]} s", flush=True)
        ray.shutdown()
        kills = {way: killed_and_rerun(way, inp, root / "kill", len(src), args) for way in times}
    same = kills["ray-data"].pop("final") == kills["parts"].pop("final")
    result = {
        **result_header("ray-data"),
        "lines": len(src),
        "workers": args.workers,
        "batch": args.batch,
        "model": "models/demo",
        "method": "full",
        "seconds": times,
        "median_s": {w: sorted(t)[len(t) // 2] for w, t in times.items()},
        "killed_and_rerun": kills,
        "same_translations": same,
    }
    print(result["median_s"], kills)
    write_result(args.out, result)


if __name__ == "__main__":
    main()

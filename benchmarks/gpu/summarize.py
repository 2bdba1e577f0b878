"""Read the GPU campaign's results (the ``gpu-<step>.json`` files a campaign brings back) and print them as
Markdown tables, each campaign goal marked met or missed: the tables that benchmarks/gpu.md reads out.

    python benchmarks/gpu/summarize.py DIR [DIR ...]     # folders holding gpu-*.json (searched recursively)

The goals: ``benchmarks/harnesses.md#gpusummarizepy``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

GOAL_N, GOAL_ROWS, GOAL_FRACTION = 128_112, 40, 0.1
GOAL_BLEU, GOAL_DIRECTIONS = 20.0, ("en-it", "it-en")


def load(dirs: list[Path]) -> dict[str, dict]:
    """The newest ``gpu-<step>.json`` per step found under ``dirs``."""
    found: dict[str, Path] = {}
    for d in dirs:
        for path in sorted(d.rglob("gpu-*.json")):
            step = path.stem.removeprefix("gpu-")
            if step not in found or path.stat().st_mtime > found[step].stat().st_mtime:
                found[step] = path
    return {step: json.loads(path.read_text()) for step, path in sorted(found.items())}


def mark(ok: bool) -> str:
    return "met" if ok else "missed"


def table(head: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(x: object) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return "-" if x is None else str(x)


def env_section(res: dict) -> str:
    meta, env = res.get("meta", {}), res.get("env", {})
    rows = [[k, meta.get(k)] for k in ("device_name", "torch", "cuda", "cupy", "commit", "date")]
    tflops = (env.get("matmul_TFLOPs") or {}).get("value")
    rows += [["copy GB/s", env.get("copy_GBps")], ["matmul TFLOP/s", tflops]]
    return "### Machine\n\n" + table(["", ""], rows)


def test_section(res: dict) -> str:
    codes = res.get("exit_codes", {})
    rows = [[k, v] for k, v in codes.items()] + [["summary", s] for s in res.get("summaries", [])]
    return "### Tests\n\n" + table(["part", "result"], rows)


def bench_section(step: str, res: dict) -> str:
    """Per size and row count: full, the fastest clustered variant, the fused GEMM alone, against full and
    against the byte floor."""
    recs = res["results"]
    out = [f"### Projection ({step})"]
    rows, goal = [], None
    keys = sorted({(r["N"], r["d"], r["rows"], r["active_fraction"]) for r in recs if r["method"] != "full"})
    for n, d, nrows, frac in keys:
        same = [r for r in recs if (r["N"], r["d"], r["rows"]) == (n, d, nrows)]
        full = next(r for r in same if r["method"] == "full")
        at = [r for r in same if r["active_fraction"] == frac]
        gemm = next((r for r in at if r["method"] == "union/cupy-gemm"), None)  # the fused GEMM alone
        best = min((r for r in at if r["method"] != "union/cupy-gemm"), key=lambda r: r["time_us"])
        rows.append([n, nrows, frac, best["dtype"], full["time_us"], f"{best['method']}/{best['backend']}",
                     best["time_us"], best["ratio_vs_full"], best.get("time_over_measured_floor"),
                     None if gemm is None else gemm["time_us"]])  # fmt: skip
        if (n, nrows, frac) == (GOAL_N, GOAL_ROWS, GOAL_FRACTION):
            goal = best
    head = ["N", "rows", "active", "dtype", "full us", "fastest clustered", "us", "x full", "x floor",
            "gather-GEMM alone us"]  # fmt: skip
    out.append(table(head, rows))
    if goal is not None:
        floor = goal.get("time_over_measured_floor")
        out.append(
            f"Goal (N {GOAL_N:,}, {GOAL_ROWS} rows, 10% active): {goal['ratio_vs_full']:.2f}x faster than "
            f"full (>= 6: {mark(goal['ratio_vs_full'] >= 6)}), {floor:.2f}x the byte floor (<= 1.3: "
            f"{mark(floor <= 1.3)})."
        )
    return "\n\n".join(out)


def static_section(res: dict, bench: dict | None) -> str:
    recs = res["results"]
    variants = sorted({r["variant"] for r in recs})
    rows = []
    for key in sorted({(r["N"], r["rows"], r["active_fraction"]) for r in recs}):
        same = {r["variant"]: r for r in recs if (r["N"], r["rows"], r["active_fraction"]) == key}
        rows.append([*key, next(iter(same.values()))["union_columns"],
                     *[same[v]["time_us"] if v in same else None for v in variants]])  # fmt: skip
    out = ["### Static-capacity union step (us)", table(["N", "rows", "active", "union", *variants], rows)]
    point = lambda r: (r["N"], r["rows"], r["active_fraction"])  # noqa: E731
    found = reversed((bench or {}).get("results", []))  # reversed: the first record of a point stays
    gemms = {point(b): b for b in found if b["method"] == "union/cupy-gemm"}
    for r in recs:
        gemm = gemms.get(point(r))
        if r["variant"] == "static/tight/graph" and gemm and point(r)[1:] == (GOAL_ROWS, GOAL_FRACTION):
            ratio = r["time_us"] / gemm["time_us"]
            out.append(
                f"Goal ({r['rows']} rows, 10% active): the graphed static step is {ratio:.2f}x the "
                f"gather-GEMM alone (<= 1.5: {mark(ratio <= 1.5)})."
            )
    return "\n\n".join(out)


def e2e_section(res: dict) -> str:
    recs = res["results"]
    smoke = res.get("meta", {}).get("smoke")
    out = ["### End to end, M2M100-418M-shaped random model"]
    timed = [r for r in recs if "tokens_per_s" in r]
    rows, goals = [], []
    for beam, batch in sorted({(r["beam"], r["batch"]) for r in timed}):
        same = {r["variant"]: r for r in timed if (r["beam"], r["batch"]) == (beam, batch)}
        fulls = {k: v for k, v in same.items() if k.startswith("full/")}
        clus = {k: v for k, v in same.items() if not k.startswith(("full/", "decoder-only"))}
        for k, v in sorted(same.items()):
            rows.append([beam, batch, k, v["tokens_per_s"], v["speedup_vs_full_static"]])
        if fulls and clus:
            bf = max(fulls.values(), key=lambda r: r["tokens_per_s"])
            bc = max(clus.values(), key=lambda r: r["tokens_per_s"])
            ratio = bc["tokens_per_s"] / bf["tokens_per_s"]
            target = {(1, 1): 1.4, (2, 20): 1.25}.get((beam, batch))
            verdict = "" if target is None or smoke else f" (>= {target}: {mark(ratio >= target)})"
            goals.append(f"beam {beam} batch {batch}: fastest clustered {bc['variant']} against fastest full "
                         f"{bf['variant']}: {ratio:.2f}x{verdict}")  # fmt: skip
    out.append(table(["beam", "batch", "variant", "tokens/s", "x full/static"], rows))
    out.append("\n".join(f"- {g}" for g in goals))
    if share := [r for r in recs if r["variant"] == "projection-share"]:
        out.append(table(["batch", "full step ms", "decoder-only step ms", "projection share"],
                         [[r["batch"], r["full_step_ms"], r["decoder_only_step_ms"],
                           r["projection_share_of_full_static_step"]] for r in share]))  # fmt: skip
        one = next((r for r in share if r["batch"] == 1), None)
        if one is not None and not smoke:
            s = one["projection_share_of_full_static_step"]
            out.append(
                f"Goal: the projection is {s:.0%} of a greedy batch-1 step (>= 30%: {mark(s >= 0.3)})."
            )
    return "\n\n".join(out)


def e2e_demo_section(res: dict) -> str:
    rows = [[r["beam"], r["batch"], r["lines"], r["variant"], r["tokens_per_s"], r["speedup_vs_full_eager"],
             f"{r['same_lines_as_eager']}/{r['lines']}", f"{r['same_lines_as_full_eager']}/{r['lines']}"]
            for r in res["results"]]  # fmt: skip
    head = ["beam", "batch", "lines", "variant", "tokens/s", "x full eager", "= its eager", "= full eager"]
    return "### End to end, demo model (`tasks.translate`)\n\n" + table(head, rows)


def dump_section(res: dict) -> str:
    keys = ("batch_size", "sentences", "states", "seconds", "states_per_s")
    rows = [[r[k] for k in keys] for r in res["results"]]
    return "### Dump\n\n" + table(["batch", "sentences", "states", "s", "states/s"], rows)


def train_section(found: dict[str, dict]) -> str:
    """One row per ``train-N`` step: steps, minutes and tokens so far, then dev BLEU per direction; the goal
    row judges the last step (the model a run would keep)."""
    steps = sorted((k for k in found if k.startswith("train-")), key=lambda k: int(k.removeprefix("train-")))
    directions = sorted({d for k in steps for d in found[k].get("dev", {})})
    rows = []
    for k in steps:
        res = found[k]
        dev = res.get("dev", {})
        tokens = f"{res.get('train_tokens', 0) / 1e6:.0f}M"
        rows.append([k, res.get("steps"), res.get("train_minutes_total"), tokens]
                    + [dev.get(d, {}).get("bleu") for d in directions])  # fmt: skip
    head = ["step", "steps", "minutes", "tokens", *directions]
    out = ["### Demo model training (dev BLEU, greedy)", table(head, rows)]
    last = found[steps[-1]]
    if not last.get("meta", {}).get("smoke"):
        bleu = {d: last.get("dev", {}).get(d, {}).get("bleu") for d in GOAL_DIRECTIONS}
        ok = all(b is not None and b >= GOAL_BLEU for b in bleu.values())
        said = ", ".join(f"{d} {b}" for d, b in bleu.items())
        goal = f"BLEU >= {GOAL_BLEU:g} on {' and '.join(GOAL_DIRECTIONS)}"
        out.append(f"Goal {goal} (dev, {steps[-1]}): {said}: {mark(ok)}")
    return "\n\n".join(out)


def summarize(found: dict[str, dict]) -> str:
    sections: dict[str, Callable[[dict], str]] = {  # in the order of the campaign's steps
        "env": env_section,
        "test": test_section,
        "bench": functools.partial(bench_section, "bench"),
        "bench-bf16": functools.partial(bench_section, "bench-bf16"),
        "static": lambda res: static_section(res, found.get("bench")),
        "e2e": e2e_section,
        "e2e-demo": e2e_demo_section,
        "dump": dump_section,
    }
    parts = [section(found[step]) for step, section in sections.items() if step in found]
    if any(k.startswith("train-") for k in found):
        parts.append(train_section(found))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="folders holding gpu-<step>.json files")
    args = p.parse_args(argv)
    if missing := [d for d in args.dirs if not d.is_dir()]:
        print(f"summarize: not a folder: {missing[0]}", file=sys.stderr)
        return 2
    if not (found := load(args.dirs)):
        print(f"summarize: no gpu-*.json under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 2
    sys.stdout.write(summarize(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())

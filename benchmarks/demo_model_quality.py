"""Quality of the committed demo model on the corpus test split, measured with the project's own commands.

    .venv/bin/python benchmarks/demo_model_quality.py --model models/demo --corpus data/corpus

What it runs and writes: ``benchmarks/harnesses.md#demo_model_qualitypy``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_meta import ROOT, bleu_chrf, git_commit

from fastvocab.artifacts_schema.corpus import available_pairs, read_direction
from fastvocab.training import TEST_SCORES_MARKER, load_saved_model, translate

FASTVOCAB = str(Path(sys.executable).with_name("fastvocab"))
MAIN = ["en-it", "it-en", "en-fr", "fr-en", "en-de", "de-en"]
EXTRA = ["en-es", "es-en", "en-pt", "pt-en"]
CHECKED = "en-it"  # the direction whose greedy outputs are checked against model.generate


def model_languages(model_dir: Path) -> set[str]:
    cfg = json.loads((model_dir / "training_summary.json").read_text())
    return {lang for d in cfg["directions"] for lang in d.split("-")}


def run_direction(args, src: str, tgt: str, tmp: Path) -> dict:
    _, sources, refs = read_direction(args.corpus, src, tgt, "test", args.limit)
    src_file, ref_file, hyp_file = (tmp / f"{src}-{tgt}.{ext}" for ext in ("src", "ref", "hyp"))
    src_file.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    ref_file.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    cmd = [
        FASTVOCAB, "translate", "--model", str(args.model), "--src-lang", src, "--tgt-lang", tgt,
        "-i", str(src_file), "-o", str(hyp_file), "--beam", "1", "--batch-size", str(args.batch_size),
        "--max-len", str(args.max_len), "--max-input-tokens", "1024", "--no-progress",
    ]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    ev = subprocess.run(
        [FASTVOCAB, "eval", "--hyp", str(hyp_file), "--ref", str(ref_file), "--tgt-lang", tgt, "--json"],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    scores = json.loads(ev.stdout)
    return {
        "sentences": scores["sentences"], **bleu_chrf(scores),
        "translate_seconds_incl_model_load": round(seconds, 1),
        "hypotheses": hyp_file.read_text(encoding="utf-8").splitlines(),
    }  # fmt: skip


def greedy_check(args, direction: str, hyps: list[str]) -> dict:
    """``fastvocab translate`` greedy output vs ``model.generate`` on the same sentences."""
    src, tgt = direction.split("-")
    _, sources, _ = read_direction(args.corpus, src, tgt, "test", args.check_sentences)
    model, tok = load_saved_model(args.model)
    ref = translate(
        model, tok, sources, src, tgt, batch_size=args.batch_size, max_len=args.max_len, adaptive_len=False
    )
    same = sum(a == b for a, b in zip(hyps[: len(sources)], ref, strict=True))
    differences = [
        {"source": s, "fastvocab": a, "generate": b}
        for s, a, b in zip(sources, hyps, ref, strict=False)
        if a != b
    ]
    return {
        "direction": direction, "sentences": len(sources), "identical": same, "differences": differences[:5],
    }  # fmt: skip


def card_section(result: dict) -> str:
    rows = ["| direction | sentences | BLEU | chrF |", "| --- | ---: | ---: | ---: |"]
    for d, s in result["directions"].items():
        rows.append(f"| {d} | {s['sentences']} | {s['bleu']:.1f} | {s['chrf']:.1f} |")
    sig = next(iter(result["directions"].values()))
    chk = result["greedy_check"]
    lines = [
        TEST_SCORES_MARKER,
        "## Test scores (the whole corpus test split, `fastvocab translate`, greedy)",
        "",
        "`fastvocab translate --beam 1 "
        f"--batch-size {result['batch_size']} --max-len {result['max_len']}` "
        f"(full projection, float32, {result['device']}), then `fastvocab eval`; commit "
        f"`{result['commit'][:12]}`, {result['date']}. Recorded in "
        "`benchmarks/results/demo-model-quality.json` (`benchmarks/demo_model_quality.py`).",
        "",
        *rows,
        "",
        f"BLEU: `{sig['bleu_signature']}`; chrF: `{sig['chrf_signature']}`.",
        "",
        f"Greedy `fastvocab translate` output equals `model.generate` on {chk['identical']} of "
        f"{chk['sentences']} {chk['direction']} test sentences.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "models" / "demo")
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--directions", default=None, help="comma-separated (default: en<->it/fr/de [+es/pt])")
    p.add_argument("--limit", type=int, default=None, help="first N test pairs per direction (default: all)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=256, help="max target tokens")
    p.add_argument("--check-sentences", type=int, default=50)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "demo-model-quality.json")
    p.add_argument("--update-card", action="store_true", help="write the test scores into the model card")
    args = p.parse_args()
    torch.set_num_threads(2)

    if args.directions:
        directions = args.directions.split(",")
    else:
        pairs = {f"{x}-{y}" for a, b in available_pairs(args.corpus) for x, y in ((a, b), (b, a))}
        langs = model_languages(args.model)
        directions = [d for d in MAIN + EXTRA if d in pairs and set(d.split("-")) <= langs]
    result: dict = {
        "model": str(args.model.relative_to(ROOT) if args.model.is_absolute() else args.model),
        "commit": git_commit("models/demo", cwd=ROOT),
        "date": dt.date.today().isoformat(),
        "device": f"CPU ({platform.machine()}), 2 torch threads, shared with other jobs",
        "dtype": "float32", "method": "full", "beam": 1, "batch_size": args.batch_size,
        "max_len": args.max_len, "split": "test",
        "model_sha256": hashlib.sha256((args.model / "model.safetensors").read_bytes()).hexdigest(),
        "model_size_bytes": {
            "model.safetensors": (args.model / "model.safetensors").stat().st_size,
            "folder": sum(f.stat().st_size for f in args.model.iterdir() if f.is_file()),
        },
        "directions": {},
    }  # fmt: skip
    summary = json.loads((args.model / "training_summary.json").read_text())
    result.update(model_params=summary["params"], vocab_size=summary["vocab_size"])
    hyps_by_direction = {}
    with tempfile.TemporaryDirectory() as tmp:
        for d in directions:
            r = run_direction(args, *d.split("-"), Path(tmp))
            hyps_by_direction[d] = r.pop("hypotheses")
            result["directions"][d] = r
            print(f"{d}: BLEU {r['bleu']:.2f} chrF {r['chrf']:.2f} ({r['sentences']} sentences)", flush=True)
    if CHECKED in hyps_by_direction:
        chk = result["greedy_check"] = greedy_check(args, CHECKED, hyps_by_direction[CHECKED])
        print(f"greedy check {chk['direction']}: {chk['identical']}/{chk['sentences']} identical to generate")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    if args.update_card and "greedy_check" in result:
        card = args.model / "README.md"
        head = card.read_text(encoding="utf-8").split(TEST_SCORES_MARKER)[0]
        card.write_text(head + card_section(result), encoding="utf-8")
        print(f"updated {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

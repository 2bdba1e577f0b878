"""GPU training of the demo model in resumable steps of under 10 minutes, for ``campaign.sh train-N``.

    python benchmarks/gpu/train.py N --out DIR [--minutes 6.5] [--resume-from FOLDER] [--smoke]

What each step writes, how a step resumes and what it trains: ``benchmarks/gpu.md``, "How gpu/train.py
runs". Only the core and ``training`` are imported: no pydantic (``pipeline``), Ray or MLflow.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PART_BYTES = 15 * 2**20  # result files are kept under 16 MiB each


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, help="step number: 1 starts a run, N > 1 resumes it")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="micro model, 2,000 pairs, CPU: checks the script")
    p.add_argument("--minutes", type=float, default=5.5, help="training minutes per step (budget N x this)")
    p.add_argument("--work", type=Path, default=Path("/tmp/fv-train"), help="checkpoint and SentencePiece")
    p.add_argument(
        "--resume-from", type=Path, default=ROOT / "work" / "gpu-carry",
        help="folder with train-<N-1>.tar.part* files (default: work/gpu-carry, carried)",
    )  # fmt: skip
    p.add_argument("--weights", type=Path, default=None, help="model folder holding step N-1's weights")
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--preset", default="cpu")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--dev-sentences", type=int, default=200)
    return p.parse_args(argv)


def smoke_corpus(src: Path, dst: Path, rows: int = 2000) -> Path:
    """The first ``rows`` pairs of each split of every pair in ``src`` (a smoke run's corpus)."""
    import pyarrow.parquet as pq

    for sub in sorted(p for p in src.glob("*-*") if (p / "train.parquet").exists()):
        (dst / sub.name).mkdir(parents=True, exist_ok=True)
        for part in (sub / f"{split}.parquet" for split in ("train", "dev", "test")):
            if part.exists():
                keep = rows if part.stem == "train" else 50
                pq.write_table(pq.read_table(part).slice(0, keep), dst / sub.name / part.name)
    return dst


def restore_from_parts(parts_dir: Path, work: Path, n_prev: int, weights: Path | None) -> None:
    """Rebuild ``work/checkpoint.pt`` (and ``work/spm``) from step ``n_prev``'s carried files: its resume
    tar and its model parts, or ``weights`` (a model folder holding exactly step ``n_prev``'s weights, e.g.
    ``models/demo`` once replaced by them: then only the resume tar, ~0.5 MiB, has to be carried)."""
    from transformers import M2M100ForConditionalGeneration

    from fastvocab.training.checkpoint import CHECKPOINT, save_checkpoint

    resume_tar = parts_dir / f"train-{n_prev}-resume.tar"
    parts = sorted(parts_dir.glob(f"train-{n_prev}-model.tar.part*"))
    if not resume_tar.exists() or not (parts or weights):
        raise SystemExit(
            f"train-{n_prev + 1}: no checkpoint in {work} (a fresh machine), and {parts_dir} lacks "
            f"train-{n_prev}-resume.tar or the weights (train-{n_prev}-model.tar.part*, or --weights DIR): "
            "carry them (see benchmarks/gpu.md, 'Running the campaign')"
        )
    restore = work / "restore"
    shutil.rmtree(restore, ignore_errors=True)
    with tarfile.open(resume_tar) as tar:
        tar.extractall(restore, filter="data")
    if parts:
        with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
            tar.extractall(restore, filter="data")
        weights = restore / "model"
    state = torch.load(restore / "resume" / "state.pt", map_location="cpu", weights_only=False)
    model = M2M100ForConditionalGeneration.from_pretrained(weights, local_files_only=True).float()
    # AdamW's moments start from zero (they are not saved); train_demo sets the resumed run's lr
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8, fused=True)
    shutil.rmtree(work / "spm", ignore_errors=True)
    shutil.copytree(restore / "resume" / "spm", work / "spm")
    save_checkpoint(work / CHECKPOINT, {**state, "model": model.state_dict(), "optimizer": opt.state_dict()})
    print(f"restored step {state['progress']['step']} from {resume_tar} and {weights}")


def write_parts(out_dir: Path, n: int, model_dir: Path, work: Path) -> list[str]:
    """``train-N-resume.tar`` (SentencePiece + the checkpoint without weights and optimizer, xz: ~0.5 MiB) and
    ``train-N-model.tar.partNN`` (the saved model folder, in parts of at most ``PART_BYTES``)."""
    from fastvocab.training.checkpoint import CHECKPOINT

    ckpt = torch.load(work / CHECKPOINT, map_location="cpu", weights_only=False)
    small = {k: v for k, v in ckpt.items() if k not in ("model", "optimizer")}
    buf = io.BytesIO()
    torch.save(small, buf)
    # xz: a third of the size, and tarfile (and tar) read a tar by its content, whatever its name says
    with tarfile.open(out_dir / f"train-{n}-resume.tar", mode="w:xz") as tar:
        for f in sorted((work / "spm").iterdir()):
            if f.name in ("spm.model", "spm.vocab", "meta.json"):
                tar.add(f, arcname=f"resume/spm/{f.name}")
        info = tarfile.TarInfo("resume/state.pt")
        info.size = buf.getbuffer().nbytes
        buf.seek(0)
        tar.addfile(info, buf)
    blob = io.BytesIO()
    with tarfile.open(fileobj=blob, mode="w") as tar:
        for f in sorted(model_dir.iterdir()):
            tar.add(f, arcname=f"model/{f.name}")
    data = blob.getvalue()
    names = [f"train-{n}-resume.tar"]
    for i in range(0, len(data), PART_BYTES):
        name = f"train-{n}-model.tar.part{i // PART_BYTES:02d}"
        (out_dir / name).write_bytes(data[i : i + PART_BYTES])
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    from steps import meta, pick_device, write_result  # meta: what every campaign result records

    from fastvocab.training import TrainConfig, train_demo
    from fastvocab.training.checkpoint import CHECKPOINT

    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / f"train-{args.n}.log"
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
        handlers=[logging.FileHandler(log_path), logging.StreamHandler()], force=True,
    )  # fmt: skip
    device = pick_device(args.smoke)
    cuda = device == "cuda"
    if cuda:  # TF32 tensor cores for the fp32 training matmuls (train_demo trains in fp32): 2-4x on Hopper
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    work = args.work / "work"
    corpus = args.corpus
    extra: dict[str, object] = {}
    if args.smoke:
        corpus = smoke_corpus(args.corpus, args.work / "corpus")
        extra = dict(
            arch=dict(vocab=400, d_model=32, ffn=64, heads=2, enc_layers=1, dec_layers=1), spm_sentences=2000,
            dev_loss_sentences=10, max_len=48,
        )  # fmt: skip
        args.minutes, args.batch_tokens, args.warmup, args.dev_sentences = 0.1, 1024, 10, 10
    if args.n == 1:  # a fresh run: no checkpoint of an earlier one (SentencePiece is reused if it fits)
        (work / CHECKPOINT).unlink(missing_ok=True)
    elif not (work / CHECKPOINT).exists():
        restore_from_parts(args.resume_from, work, args.n - 1, args.weights)
    if not corpus.is_dir():
        raise SystemExit(f"no corpus at {corpus}: carry data/corpus/<pair>/ (see docs/corpus.md)")
    model_dir = args.work / "model"
    command = " ".join(["benchmarks/gpu/train.py", *(argv if argv is not None else sys.argv[1:])])
    cfg = TrainConfig(
        corpus=corpus, out=model_dir, work_dir=work, preset=args.preset, max_minutes=args.n * args.minutes,
        batch_tokens=args.batch_tokens, lr=args.lr, warmup=args.warmup, dropout=args.dropout, device=device,
        threads=min(16, os.cpu_count() or 1) if cuda else 2, dev_sentences=args.dev_sentences,
        checkpoint_minutes=2.0, resume=args.n > 1, command=command, **extra,  # type: ignore[arg-type]
    )  # fmt: skip
    t0 = time.perf_counter()
    result = train_demo(cfg)
    wall = time.perf_counter() - t0
    parts = write_parts(args.out, args.n, model_dir, work)
    payload = {
        "meta": meta(device, args, command=cfg.command, preset=args.preset, tf32=cuda), "step": args.n,
        "wall_s": wall, "steps": result.steps, "train_tokens": result.train_tokens,
        "train_minutes_total": result.minutes, "params": result.params, "dev": result.dev,
        "history": result.history, "parts": parts,
    }  # fmt: skip
    write_result(args.out / f"gpu-train-{args.n}.json", payload)
    print(f"train-{args.n}: {result.steps} steps, {result.minutes:.1f} min trained, {wall:.0f} s wall")
    for d, s in result.dev.items():
        print(f"dev {d}: BLEU {s['bleu']:.1f} chrF {s['chrf']:.1f}")
    print(f"parts: {', '.join(parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

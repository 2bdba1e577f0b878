"""``fastvocab train-demo``: train the small many-to-many demo model (M2M100 architecture) on the corpus."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from fastvocab.pipeline.commands import add_examples, add_output
from fastvocab.pipeline.errors import UserError

WORK_ROOT = Path("work") / "train-demo"

DESCRIPTION = """\
Train a many-to-many translation model in the M2M100 architecture from scratch (built from a config,
nothing downloaded) on a parallel corpus written by `fastvocab corpus`: a shared SentencePiece vocabulary,
target-language tags, an output layer tied to the embeddings and without bias. Trains both directions of every
language pair in the corpus (or --directions), mixing directions by temperature sampling so small pairs are
not drowned.

Presets (architecture; default budget):
  tiny   8K vocabulary, d_model 256, 3+2 layers; 5 minutes of training on 2 CPU cores (under 10 minutes
         end to end on idle cores). For smoke runs; it does not translate yet.
  cpu    32K vocabulary, d_model 256, 4+2 layers (the committed models/demo: big vocabulary and lean decoder,
         so the output projection is a large share of a step); 45 minutes on 2 CPU cores, which leave it
         undertrained (test BLEU < 3 after 55 minutes). On a GPU, 9 minutes with --device cuda
         --batch-tokens 16384 --lr 1e-3 --warmup 1000 --dropout 0.1 give test BLEU 30-53 (models/demo).
  base   32K vocabulary, d_model 512, 6+2 layers (deep encoder, shallow decoder); 60K steps. For a GPU.

The run checkpoints to --work-dir every few minutes (model, optimizer, schedule, data position) and resumes
from there when started again; --max-minutes counts training time over all sessions, and a resumed session
may raise the budget or change --lr/--dropout (the model card lists every session).
The output folder holds fp16 safetensors weights, the tokenizer and a model card (README.md) with the dev
BLEU/chrF of every direction; it loads offline with AutoModelForSeq2SeqLM / AutoTokenizer.
"""

EXAMPLES = """\
examples:
  fastvocab train-demo --preset tiny
  fastvocab train-demo --preset tiny --max-minutes 2 -o work/my-model
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    add_examples(parser, EXAMPLES)
    parser.add_argument(
        "--preset",
        choices=["tiny", "cpu", "base"],
        default="tiny",
        help="model size, above (default: %(default)s)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=Path("data/corpus"),
        metavar="DIR",
        help="corpus folder (default: %(default)s)",
    )
    add_output(
        parser,
        f"model folder (default: {WORK_ROOT}/<preset>/model, beside the run's checkpoint; the shipped "
        "models/ are never written unless named)",
        metavar="DIR",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a model already in --output (without it, a folder holding a model is refused, "
        "unless this run's own work dir trained it: a resumed run saves there again)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"checkpoint, SentencePiece model and log (default: {WORK_ROOT}/<name of --output>, or "
        f"{WORK_ROOT}/<preset> without --output)",
    )
    preset = "(default: the preset's)"
    parser.add_argument(
        "--max-minutes", type=float, default=None, metavar="M", help=f"training wall-clock budget {preset}"
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, metavar="N", help=f"training step budget {preset}"
    )
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        metavar="N",
        help=f"padded tokens per batch and side {preset}",
    )
    parser.add_argument("--lr", type=float, default=None, metavar="LR", help=f"peak learning rate {preset}")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help=f"warmup steps of the inverse-sqrt schedule {preset}",
    )
    parser.add_argument(
        "--dropout", type=float, default=None, metavar="P", help="dropout (default: tiny, cpu: 0; base: 0.1)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=2.0,
        metavar="T",
        help="direction sampling temperature, p(direction) ~ pairs^(1/T) (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        metavar="N",
        help="seed of the initial weights, the batch order, the vocabulary's sample (default: %(default)s)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=2, metavar="N", help="CPU threads for torch (default: %(default)s)"
    )
    parser.add_argument(
        "--directions",
        default=None,
        metavar="SRC-TGT,...",
        help="comma-separated directions, e.g. en-it,it-en (default: both ways of every pair in the corpus)",
    )
    parser.add_argument(
        "--dev-sentences",
        type=int,
        default=200,
        metavar="N",
        help="dev pairs per direction translated for the model card's scores (default: %(default)s)",
    )
    parser.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=5.0,
        metavar="M",
        help="minutes of training between checkpoints, the work a kill can lose (default: %(default)s)",
    )
    parser.add_argument(
        "--no-resume", dest="resume", action="store_false", help="start over, ignoring a checkpoint"
    )


def run(args: argparse.Namespace) -> int:
    # Before torch loads OpenMP: idle worker threads sleep instead of spinning. On a machine whose cores are
    # shared with other jobs, spinning threads steal each other's time slices (2 threads ran at half the
    # speed of 1 in our measurement); sleeping ones cost nothing when the cores are free.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fastvocab.artifacts_schema.corpus import available_pairs
    from fastvocab.training import TrainConfig, parse_direction, train_demo

    if not args.corpus.is_dir() or not available_pairs(args.corpus):
        raise UserError(
            f"no corpus at {args.corpus}: build one with `fastvocab corpus --output {args.corpus}`"
        )
    directions = None
    if args.directions:
        directions = [d.strip() for d in args.directions.split(",") if d.strip()]
        try:
            for d in directions:
                parse_direction(d)
        except ValueError as exc:
            raise UserError(f"--directions: {exc}") from exc
    for name in ("max_minutes", "max_steps", "batch_tokens", "lr", "warmup"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {args.dropout}")
    from fastvocab.pipeline.checks import check_device

    check_device(args.device, "--device")
    if args.output is None:
        work_dir = args.work_dir or WORK_ROOT / args.preset
        out = work_dir / "model"
    else:
        out = args.output
        work_dir = args.work_dir or WORK_ROOT / out.name
    check_output_free(out, work_dir, args.overwrite)
    cfg = TrainConfig(
        corpus=args.corpus,
        out=out,
        work_dir=work_dir,
        preset=args.preset,
        directions=directions,
        max_minutes=args.max_minutes,
        max_steps=args.max_steps,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        warmup=args.warmup,
        dropout=args.dropout,
        temperature=args.temperature,
        seed=args.seed,
        device=args.device,
        threads=args.threads,
        dev_sentences=args.dev_sentences,
        checkpoint_minutes=args.checkpoint_minutes,
        resume=args.resume,
        command=_command_line(args),
    )
    try:
        result = train_demo(cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    print(
        f"saved {result.out} ({result.params / 1e6:.2f}M parameters, {result.steps} steps, "
        f"{result.minutes:.1f} min)"
    )
    for d, s in result.dev.items():
        print(f"dev {d}: BLEU {s['bleu']:.1f} chrF {s['chrf']:.1f}")
    return 0


def check_output_free(out: Path, work_dir: Path, overwrite: bool) -> None:
    """Refuse to train into a folder that holds something, unless ``overwrite``, or the folder holds the
    model this run's own ``work_dir`` trained (its training summary names that work dir: a resumed run)."""
    if overwrite or not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--output {out} is a file, not a model folder")
    if not any(out.iterdir()):
        return
    from fastvocab.artifacts_schema.errors import ArtifactError
    from fastvocab.artifacts_schema.jsonfile import read_json

    try:
        summary = read_json(out / "training_summary.json", "training summary") or {}
    except ArtifactError:  # unreadable: not provably this run's, so refused like any other content
        summary = {}
    trained_by = summary.get("work_dir")
    if trained_by is not None and Path(trained_by).resolve() == work_dir.resolve():
        return
    raise UserError(
        f"--output {out} already holds a model that this run's work dir {work_dir} did not train; "
        "pass --overwrite to replace it, or name another folder with -o"
    )


def _command_line(args: argparse.Namespace) -> str:
    """The command as a user would type it, rebuilt from the parsed arguments (for the model card)."""
    parts = ["fastvocab", "train-demo"]
    for action in _FLAGS:
        value = getattr(args, action)
        if value is not None:
            parts += [f"--{action.replace('_', '-')}", str(value)]
    if not args.resume:
        parts.append("--no-resume")
    if args.overwrite:
        parts.append("--overwrite")
    return " ".join(shlex.quote(p) for p in parts)


_FLAGS = (
    "preset",
    "corpus",
    "output",
    "work_dir",
    "max_minutes",
    "max_steps",
    "batch_tokens",
    "lr",
    "warmup",
    "dropout",
    "temperature",
    "seed",
    "device",
    "threads",
    "directions",
)

"""Train the demo model: a small many-to-many M2M100 on the parallel corpus, from scratch.

Plain functions over paths; ``train_demo`` runs the whole job:

1. read the train split of every direction (both directions of each language pair),
2. train a shared SentencePiece vocabulary on a language-balanced sample of the train texts,
3. build the M2M100 tokenizer and model (``tasks.demo_model``; tied LM head, no output bias),
4. train: AdamW, inverse-sqrt schedule with warmup, label smoothing, token-count batches built from length
   buckets, directions mixed by temperature sampling (small pairs are upsampled, not drowned),
5. checkpoint atomically every few minutes (model, optimizer, scheduler, sampler position, RNG states), so a
   killed run resumes where it stopped,
6. save the model in fp16 with ``save_pretrained`` next to its tokenizer, reload the saved folder with
   ``AutoModelForSeq2SeqLM``/``AutoTokenizer``, score it on the dev split (greedy, sacrebleu BLEU/chrF per
   direction) and write a model card.

Sequences follow the M2M100 convention: encoder input ``__src__ tokens </s>``, labels ``__tgt__ tokens </s>``,
decoder input = labels shifted right behind ``</s>`` (the decoder start token). At generation time the target
tag is forced as the first token (``forced_bos_token_id``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import random
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from fastvocab import __version__
from fastvocab.artifacts_schema.corpus import available_pairs, read_direction
from fastvocab.tasks.demo_model import (
    PRESETS,
    TRAIN_DEFAULTS,
    build_tokenizer,
    model_config,
    train_sentencepiece,
)

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"


# ----------------------------------------------------------------------------------------------- config


@dataclass
class TrainConfig:
    """Everything a training run depends on; ``None`` fields take the preset's ``TRAIN_DEFAULTS``."""

    corpus: Path
    out: Path
    work_dir: Path  # SentencePiece model, checkpoint, training log (not part of the saved model)
    preset: str = "tiny"
    arch: dict[str, int] | None = None  # overrides the preset's architecture (tests use a micro model)
    directions: list[str] | None = None  # "en-it", ...; None: both directions of every pair in the corpus
    max_minutes: float | None = None  # training wall-clock budget, summed over resumed sessions
    max_steps: int | None = None
    batch_tokens: int | None = None  # padded tokens per batch (max of source and target side)
    lr: float | None = None
    warmup: int | None = None
    dropout: float | None = None
    seed: int = 1
    device: str = "cpu"
    threads: int = 2
    label_smoothing: float = 0.1
    weight_decay: float = 0.0001
    clip_norm: float = 1.0
    max_len: int = 128  # tokens per side, tags and </s> included; longer pairs are dropped
    temperature: float = 2.0  # direction sampling: p(d) ~ n(d)^(1/T); 1 = natural sizes
    spm_sentences: int = 300_000  # SentencePiece training sample, balanced over languages
    checkpoint_minutes: float = 5.0
    log_every: int = 25
    dev_loss_sentences: int = 50  # per direction, scored at every checkpoint
    dev_sentences: int = 200  # per direction, translated (greedy) for the model card
    eval_batch_size: int = 32
    resume: bool = True
    command: str | None = None  # the command line that started the run, for the model card

    def resolved(self) -> TrainConfig:
        """A copy with the preset's defaults filled in and paths as ``Path``."""
        if self.arch is None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; valid: {', '.join(sorted(PRESETS))}")
        defaults = TRAIN_DEFAULTS.get(self.preset, TRAIN_DEFAULTS["tiny"])
        cfg = TrainConfig(**{**asdict(self)})
        cfg.corpus, cfg.out, cfg.work_dir = Path(self.corpus), Path(self.out), Path(self.work_dir)
        cfg.arch = dict(self.arch) if self.arch is not None else dict(PRESETS[self.preset])
        for name in ("batch_tokens", "lr", "warmup", "dropout"):
            if getattr(cfg, name) is None:
                setattr(cfg, name, defaults[name])
        if cfg.max_minutes is None and cfg.max_steps is None:
            cfg.max_minutes = defaults.get("max_minutes")
            steps = defaults.get("max_steps")
            cfg.max_steps = int(steps) if steps is not None else None
        if cfg.max_minutes is None and cfg.max_steps is None:
            raise ValueError("give a training budget: max_minutes and/or max_steps")
        return cfg


# ------------------------------------------------------------------------------------------------- data


def parse_direction(direction: str) -> tuple[str, str]:
    src, sep, tgt = direction.partition("-")
    if not sep or not src or not tgt or src == tgt:
        raise ValueError(f"bad direction {direction!r}: expected SRC-TGT, e.g. en-it")
    return src, tgt


def corpus_directions(corpus_dir: str | Path) -> list[str]:
    """Both directions of every language pair in the corpus, e.g. ``["en-it", "it-en", ...]``."""
    dirs = []
    for a, b in available_pairs(corpus_dir):
        dirs += [f"{a}-{b}", f"{b}-{a}"]
    return dirs


def load_parallel(
    corpus_dir: str | Path, directions: Sequence[str], split: str, limit: int | None = None
) -> dict[str, tuple[list[str], list[str]]]:
    """(sources, targets) per direction for one split; empty or whitespace-only pairs are left out."""
    data = {}
    for d in directions:
        src, tgt = parse_direction(d)
        _, s, t = read_direction(corpus_dir, src, tgt, split, limit)
        keep = [i for i in range(len(s)) if s[i].strip() and t[i].strip()]
        data[d] = ([s[i] for i in keep], [t[i] for i in keep])
    return data


def languages_of(directions: Sequence[str]) -> list[str]:
    """Languages in order of first appearance (the first two become the tokenizer's defaults)."""
    langs: list[str] = []
    for d in directions:
        for lang in parse_direction(d):
            if lang not in langs:
                langs.append(lang)
    return langs


def spm_sample(data: dict[str, tuple[list[str], list[str]]], total: int, seed: int) -> list[str]:
    """A language-balanced sample of unique texts: at most ``total / n_languages`` per language."""
    per_lang: dict[str, set[str]] = {}
    for d, (s, t) in data.items():
        src, tgt = parse_direction(d)
        per_lang.setdefault(src, set()).update(s)
        per_lang.setdefault(tgt, set()).update(t)
    cap = max(1, total // max(1, len(per_lang)))
    rng = random.Random(seed)
    sample = []
    for lang in sorted(per_lang):
        texts = sorted(per_lang[lang])
        sample += rng.sample(texts, cap) if len(texts) > cap else texts
        log.info("SentencePiece sample: %s %d of %d unique texts", lang, min(cap, len(texts)), len(texts))
    return sample


@dataclass
class Encoded:
    """Token ids of one direction: ``src[i]`` = ``__src__ ... </s>``, ``tgt[i]`` = ``__tgt__ ... </s>``."""

    src: list[np.ndarray]
    tgt: list[np.ndarray]
    dropped: int = 0  # pairs longer than max_len on either side


def encode_direction(
    tokenizer, sources: list[str], targets: list[str], src_lang: str, tgt_lang: str, max_len: int
) -> Encoded:
    """Encode with the SentencePiece model in bulk (C++, threaded), as the tokenizer would.

    The tokenizer's ``vocab.json`` maps SentencePiece id i to id i (specials 0-3 agree by construction),
    which ``check_encoding`` verifies on a sample against the tokenizer itself.
    """
    sp = tokenizer.sp_model
    eos = tokenizer.eos_token_id
    s_tag, t_tag = tokenizer.get_lang_id(src_lang), tokenizer.get_lang_id(tgt_lang)
    s_ids = sp.encode(sources, num_threads=2)
    t_ids = sp.encode(targets, num_threads=2)
    enc = Encoded([], [])
    for a, b in zip(s_ids, t_ids, strict=True):
        if len(a) + 2 > max_len or len(b) + 2 > max_len:
            enc.dropped += 1
            continue
        enc.src.append(np.array([s_tag, *a, eos], dtype=np.int32))
        enc.tgt.append(np.array([t_tag, *b, eos], dtype=np.int32))
    return enc


def check_encoding(tokenizer, sources: list[str], targets: list[str], src_lang: str, tgt_lang: str) -> None:
    """Raise if the bulk encoding differs from ``tokenizer(src, text_target=tgt)`` (the M2M100 convention)."""
    if not sources:
        return
    enc = encode_direction(tokenizer, sources, targets, src_lang, tgt_lang, max_len=10**9)
    tokenizer.src_lang, tokenizer.tgt_lang = src_lang, tgt_lang
    ref = tokenizer(sources, text_target=targets)
    for i in range(len(sources)):
        if list(enc.src[i]) != ref["input_ids"][i] or list(enc.tgt[i]) != ref["labels"][i]:
            raise RuntimeError(
                f"bulk encoding disagrees with the tokenizer on {src_lang}-{tgt_lang} pair {i}: "
                f"{sources[i]!r} -> {list(enc.src[i])} vs {ref['input_ids'][i]}"
            )


# ---------------------------------------------------------------------------------------------- sampler


class BatchStream:
    """Deterministic, resumable stream of token-count batches over all directions.

    Each virtual epoch draws ``n(d)`` examples per direction with ``n(d) ~ size(d)^(1/T)`` (so small
    directions are upsampled), sorts them by length with random tie-breaks (length buckets: little padding),
    cuts batches of at most ``batch_tokens`` padded tokens and shuffles the batch order. An epoch depends only
    on (seed, epoch), so the stream's state is two integers.
    """

    def __init__(
        self, lengths: dict[str, np.ndarray], batch_tokens: int, temperature: float, seed: int
    ) -> None:
        self.directions = sorted(lengths)
        self.lengths = [np.asarray(lengths[d], dtype=np.int64) for d in self.directions]
        sizes = np.array([len(x) for x in self.lengths], dtype=np.float64)
        if sizes.sum() == 0:
            raise ValueError("no training pairs left (all empty or longer than max_len)")
        if max(int(x.max()) if len(x) else 0 for x in self.lengths) > batch_tokens:
            raise ValueError(f"batch_tokens={batch_tokens} is smaller than the longest training sequence")
        weights = np.where(sizes > 0, sizes ** (1.0 / temperature), 0.0)
        self.probs = weights / weights.sum()
        self.epoch_size = int(sizes.sum())
        self.quota = np.round(self.probs * self.epoch_size).astype(np.int64)
        self.batch_tokens = batch_tokens
        self.seed = seed
        self.epoch, self.pos = 0, 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The batches of one virtual epoch; each is an int64 array of (direction index, example index)."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, epoch])
        picks, lens = [], []
        for k, (n, lengths) in enumerate(zip(self.quota, self.lengths, strict=True)):
            if n == 0 or len(lengths) == 0:
                continue
            reps = -(-int(n) // len(lengths))  # upsampling repeats whole permutations
            idx = np.concatenate([rng.permutation(len(lengths)) for _ in range(reps)])[:n]
            picks.append(np.stack([np.full(n, k), idx], axis=1))
            lens.append(lengths[idx])
        pairs, plen = np.concatenate(picks), np.concatenate(lens)
        order = np.lexsort((rng.random(len(plen)), plen))  # by length, random among equal lengths
        batches, start, longest = [], 0, 0
        for i, j in enumerate(order):
            longest_if = max(longest, int(plen[j]))
            if (i - start + 1) * longest_if > self.batch_tokens:
                batches.append(pairs[order[start:i]])
                start, longest_if = i, int(plen[j])
            longest = longest_if
        batches.append(pairs[order[start:]])
        rng.shuffle(batches)
        self._cache = (epoch, batches)
        return batches

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            batches = self.epoch_batches(self.epoch)
            if self.pos >= len(batches):
                self.epoch, self.pos = self.epoch + 1, 0
                continue
            batch = batches[self.pos]
            self.pos += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def collate(
    data: list[Encoded], batch: np.ndarray, pad_id: int, decoder_start_id: int
) -> dict[str, torch.Tensor]:
    """Pad one batch; decoder input = labels shifted right behind the decoder start token (``</s>``)."""
    src = [data[k].src[i] for k, i in batch]
    tgt = [data[k].tgt[i] for k, i in batch]
    b, ls, lt = len(batch), max(map(len, src)), max(map(len, tgt))
    input_ids = np.full((b, ls), pad_id, dtype=np.int64)
    labels = np.full((b, lt), pad_id, dtype=np.int64)
    for r, (s, t) in enumerate(zip(src, tgt, strict=True)):
        input_ids[r, : len(s)] = s
        labels[r, : len(t)] = t
    dec_in = np.full_like(labels, pad_id)
    dec_in[:, 0] = decoder_start_id
    dec_in[:, 1:] = labels[:, :-1]
    input_ids_t = torch.from_numpy(input_ids)
    return {
        "input_ids": input_ids_t,
        "attention_mask": (input_ids_t != pad_id).long(),
        "decoder_input_ids": torch.from_numpy(dec_in),
        "labels": torch.from_numpy(labels),
    }


# ----------------------------------------------------------------------------------------------- model


def inverse_sqrt(warmup: int):
    """LR multiplier: linear warmup to 1 at ``warmup`` steps, then ``sqrt(warmup / step)``."""

    def f(step: int) -> float:
        step = max(step, 1)
        return min(step / warmup, math.sqrt(warmup / step))

    return f


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy of ``h @ weight.T`` computed in row chunks, gradients included.

    The (tokens, 32K) logits matrix never exists whole: each chunk's logits are turned into the loss and
    straight into the gradient (softmax minus the smoothed target) while they are still in cache. On CPU this
    saves most of the memory-bound passes of log_softmax forward and backward over a ~400 MB matrix.
    Returns (loss, nll), both means over rows; only ``loss`` carries a gradient.
    """

    @staticmethod
    def forward(ctx, h, weight, target, smoothing: float, chunk: int):  # type: ignore[override]
        n, vocab = h.shape[0], weight.shape[0]
        grad_h = torch.empty_like(h)  # (n, d)
        grad_w = torch.zeros_like(weight)  # (V, d)
        loss_sum = torch.zeros((), dtype=torch.float64)
        nll_sum = torch.zeros((), dtype=torch.float64)
        for s in range(0, n, chunk):
            hc, tc = h[s : s + chunk], target[s : s + chunk]
            logits = hc @ weight.T  # (c, V)
            lse = torch.logsumexp(logits, dim=-1)  # (c,)
            nll = lse - logits.gather(1, tc[:, None]).squeeze(1)
            smooth = lse - logits.mean(dim=-1)
            loss_sum += ((1.0 - smoothing) * nll + smoothing * smooth).sum().double()
            nll_sum += nll.sum().double()
            # d loss_row / d logits = softmax - (1 - eps) * onehot - eps / V, all divided by n (the mean)
            g = logits.sub_(lse[:, None]).exp_().sub_(smoothing / vocab)
            g[torch.arange(len(tc)), tc] -= 1.0 - smoothing
            g.mul_(1.0 / n)
            torch.mm(g, weight, out=grad_h[s : s + chunk])
            grad_w.addmm_(g.T, hc)
        ctx.save_for_backward(grad_h, grad_w)
        nll_mean = (nll_sum / n).to(h.dtype)
        ctx.mark_non_differentiable(nll_mean)
        return (loss_sum / n).to(h.dtype), nll_mean

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, None, None, None


def seq2seq_loss(
    model, batch: dict[str, torch.Tensor], pad_id: int, label_smoothing: float, chunk: int | None = 1024
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(label-smoothed loss, nll) averaged over target tokens, and the number of target tokens.

    The LM head runs only on non-pad positions: on CPU the 32K-column projection is most of a step, and
    padded positions would only be thrown away. ``chunk`` rows at a time through
    ``_ChunkedLinearCrossEntropy`` (CPU); ``None``: the plain full-matrix path (used on GPU, and as its test
    oracle).
    """
    out = model.model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
        use_cache=False,
    )
    labels = batch["labels"]
    keep = labels != pad_id  # (B, T)
    h = out.last_hidden_state[keep]  # (n, d)
    target = labels[keep]
    head = model.get_output_embeddings()
    if head.bias is not None:
        raise ValueError("the demo model's output layer must have no bias")
    if chunk is not None and h.dtype == torch.float32:
        loss, nll = _ChunkedLinearCrossEntropy.apply(h, head.weight, target, label_smoothing, chunk)
        return loss, nll.detach(), int(target.numel())
    lprobs = F.log_softmax(head(h).float(), dim=-1)  # (n, V)
    nll = -lprobs.gather(1, target[:, None]).squeeze(1).mean()
    smooth = -lprobs.mean(dim=-1).mean()
    loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    return loss, nll.detach(), int(target.numel())


@torch.no_grad()
def dev_loss(model, data: list[Encoded], pad_id: int, decoder_start_id: int, batch_tokens: int) -> float:
    """Mean token nll of the dev pairs (no smoothing, no dropout)."""
    was_training = model.training
    model.eval()
    pairs = [(k, i) for k, e in enumerate(data) for i in range(len(e.src))]
    pairs.sort(key=lambda p: max(len(data[p[0]].src[p[1]]), len(data[p[0]].tgt[p[1]])))
    total, n = 0.0, 0
    start = 0
    while start < len(pairs):
        longest = max(len(data[pairs[start][0]].src[pairs[start][1]]), 1)
        end = start
        while end < len(pairs):
            k, i = pairs[end]
            longest = max(longest, len(data[k].src[i]), len(data[k].tgt[i]))
            if (end - start + 1) * longest > batch_tokens and end > start:
                break
            end += 1
        batch = collate(data, np.array(pairs[start:end]), pad_id, decoder_start_id)
        _, nll, ntok = seq2seq_loss(model, batch, pad_id, 0.0)
        total, n = total + float(nll) * ntok, n + ntok
        start = end
    model.train(was_training)
    return total / max(n, 1)


def count_parameters(model) -> int:
    """Parameters counted once (the tied LM head shares the embedding matrix)."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------- checkpoint


def save_checkpoint(path: Path, state: dict) -> None:
    """Write atomically: a killed run leaves either the old checkpoint or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


# ----------------------------------------------------------------------------------------------- eval


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sources: list[str],
    src_lang: str,
    tgt_lang: str,
    *,
    batch_size: int = 32,
    max_len: int = 128,
    adaptive_len: bool = True,
    device: str = "cpu",
) -> list[str]:
    """Greedy ``model.generate`` with the target tag forced first; length-sorted batches, input order kept.

    ``max_len`` counts target tokens after the language tag (as ``fastvocab translate --max-len``). With
    ``adaptive_len`` a batch may generate at most twice its source length + 10 tokens, so an undertrained
    model does not run to ``max_len`` on every batch.
    """
    tokenizer.src_lang = src_lang
    forced = tokenizer.get_lang_id(tgt_lang)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        enc = tokenizer([sources[i] for i in idx], return_tensors="pt", padding=True).to(device)
        limit = min(max_len, 2 * enc["input_ids"].shape[1] + 10) if adaptive_len else max_len
        # max_length counts the decoder start and the tag too: ``limit`` tokens after the tag
        gen = model.generate(
            **enc, forced_bos_token_id=forced, num_beams=1, do_sample=False, max_length=limit + 2
        )
        for i, text in zip(idx, tokenizer.batch_decode(gen, skip_special_tokens=True), strict=True):
            out[i] = text
    return out


def score(hyps: list[str], refs: list[str]) -> dict[str, object]:
    """sacrebleu BLEU and chrF with their signatures."""
    import sacrebleu

    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hyps),
    }


def load_saved_model(model_dir: str | Path, device: str = "cpu"):
    """Reload a saved folder the way a user would (Auto classes, offline), in float32 for CPU decoding."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    return model.to(device).eval(), tok


# ------------------------------------------------------------------------------------------------ train


@dataclass
class TrainResult:
    out: Path
    steps: int
    train_tokens: int  # non-pad source + target tokens seen
    minutes: float
    params: int
    dev: dict[str, dict[str, object]] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)  # checkpoints, with dev nll
    train_log: list[dict[str, float]] = field(default_factory=list)  # every logging window


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt, so ``kill PID`` saves a checkpoint before the run stops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class Prepared:
    """Everything derived from the corpus before training starts."""

    directions: list[str]  # as given (or found in the corpus)
    langs: list[str]
    tokenizer: object
    train_pairs: dict[str, int]
    dropped: dict[str, int]
    stream: BatchStream
    encoded: list[Encoded]  # in ``stream.directions`` order
    dev_encoded: list[Encoded]


def prepare(cfg: TrainConfig) -> Prepared:
    """Read the corpus, train (or reuse) the SentencePiece model, build the tokenizer, encode the pairs.

    The SentencePiece model is reused only when it was trained for the same directions and vocabulary size:
    a resumed run must see exactly the vocabulary its checkpoint was trained with.
    """
    directions = list(cfg.directions or corpus_directions(cfg.corpus))
    if not directions:
        raise ValueError(f"no language pairs in {cfg.corpus}")
    train = load_parallel(cfg.corpus, directions, "train")
    counts = {d: len(train[d][0]) for d in directions}
    log.info("training pairs per direction: %s", counts)
    langs = languages_of(directions)
    vocab = int(cfg.arch["vocab"])  # type: ignore[index]
    spm_dir = cfg.work_dir / "spm"
    meta = {"vocab": vocab, "directions": directions, "seed": cfg.seed, "spm_sentences": cfg.spm_sentences}
    meta_path = spm_dir / "meta.json"
    if not (meta_path.exists() and json.loads(meta_path.read_text()) == meta):
        t0 = time.perf_counter()
        train_sentencepiece(spm_sample(train, cfg.spm_sentences, cfg.seed), vocab, spm_dir)
        meta_path.write_text(json.dumps(meta))
        log.info("SentencePiece (%d pieces) trained in %.0f s", vocab, time.perf_counter() - t0)
    tokenizer = build_tokenizer(spm_dir / "spm.model", langs, cfg.work_dir / "tokenizer")
    for d in directions:
        check_encoding(tokenizer, train[d][0][:50], train[d][1][:50], *parse_direction(d))
    encoded = {
        d: encode_direction(tokenizer, *train[d], *parse_direction(d), cfg.max_len) for d in directions
    }
    del train
    dev = load_parallel(cfg.corpus, directions, "dev", limit=cfg.dev_loss_sentences)
    dev_encoded = [encode_direction(tokenizer, *dev[d], *parse_direction(d), cfg.max_len) for d in directions]
    lengths = {
        d: np.array([max(len(a), len(b)) for a, b in zip(e.src, e.tgt, strict=True)])
        for d, e in encoded.items()
    }
    stream = BatchStream(lengths, cfg.batch_tokens, cfg.temperature, cfg.seed)  # type: ignore[arg-type]
    log.info(
        "direction sampling (T=%.1f): %s",
        cfg.temperature,
        ", ".join(f"{d} {p:.3f}" for d, p in zip(stream.directions, stream.probs, strict=True)),
    )
    return Prepared(
        directions=directions,
        langs=langs,
        tokenizer=tokenizer,
        train_pairs=counts,
        dropped={d: e.dropped for d, e in encoded.items()},
        stream=stream,
        encoded=[encoded[d] for d in stream.directions],
        dev_encoded=dev_encoded,
    )


@dataclass
class _Progress:
    step: int = 0
    tokens: int = 0  # non-pad source + target tokens
    elapsed: float = 0.0  # seconds of training wall clock, summed over resumed sessions
    history: list[dict] = field(default_factory=list)  # one entry per checkpoint
    last_train: dict = field(default_factory=dict)  # means over the last logging window
    train_log: list[dict] = field(default_factory=list)  # every logging window: step, loss, nll, lr, tok/s
    sessions: list[dict] = field(default_factory=list)  # budget and recipe of every (resumed) session


def _save_state(
    path: Path, cfg: TrainConfig, prep: Prepared, model, optimizer, scheduler, prog: _Progress
) -> None:
    pad, eos = prep.tokenizer.pad_token_id, prep.tokenizer.eos_token_id  # type: ignore[attr-defined]
    entry = {"step": prog.step, "minutes": round(prog.elapsed / 60, 2), "tokens": prog.tokens}
    entry["dev_nll"] = round(dev_loss(model, prep.dev_encoded, pad, eos, cfg.batch_tokens), 4)  # type: ignore[arg-type]
    prog.history.append(entry | prog.last_train)
    save_checkpoint(
        path,
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "sampler": prep.stream.state_dict(),
            "rng": _rng_state(),
            "progress": asdict(prog),
            "arch": cfg.arch,
            "directions": prep.directions,
        },
    )
    log.info("checkpoint at step %d: %s", prog.step, json.dumps(prog.history[-1]))


def _budget_spent(cfg: TrainConfig, prog: _Progress) -> bool:
    return (cfg.max_steps is not None and prog.step >= cfg.max_steps) or (
        cfg.max_minutes is not None and prog.elapsed >= cfg.max_minutes * 60
    )


def _train_loop(
    cfg: TrainConfig, prep: Prepared, model, optimizer, scheduler, prog: _Progress, ckpt: Path
) -> None:
    pad, eos = prep.tokenizer.pad_token_id, prep.tokenizer.eos_token_id  # type: ignore[attr-defined]
    cuda = cfg.device.startswith("cuda")
    window = {"loss": 0.0, "nll": 0.0, "n": 0, "tok": 0, "t": 0.0}
    last_ckpt = prog.elapsed
    bar = tqdm(
        total=cfg.max_steps, initial=prog.step, desc="train", unit="step", mininterval=5, dynamic_ncols=True
    )
    batches = iter(prep.stream)
    model.train()
    try:
        while not _budget_spent(cfg, prog):
            t0 = time.perf_counter()
            batch = {k: v.to(cfg.device) for k, v in collate(prep.encoded, next(batches), pad, eos).items()}
            with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
                loss, nll, _ = seq2seq_loss(
                    model, batch, pad, cfg.label_smoothing, chunk=None if cuda else 1024
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            optimizer.step()
            scheduler.step()
            ntok = int(batch["attention_mask"].sum()) + int((batch["labels"] != pad).sum())
            dt = time.perf_counter() - t0
            prog.step, prog.tokens, prog.elapsed = prog.step + 1, prog.tokens + ntok, prog.elapsed + dt
            for k, v in (
                ("loss", float(loss.detach())),
                ("nll", float(nll)),
                ("n", 1),
                ("tok", ntok),
                ("t", dt),
            ):
                window[k] += v
            bar.update(1)
            if prog.step % cfg.log_every == 0 or _budget_spent(cfg, prog):
                n = window["n"]
                prog.last_train = {
                    "loss": round(window["loss"] / n, 4),
                    "nll": round(window["nll"] / n, 4),
                    "lr": float(scheduler.get_last_lr()[0]),
                    "tok_per_s": round(window["tok"] / window["t"]),
                }
                prog.train_log.append({"step": prog.step} | prog.last_train)
                bar.set_postfix(loss=prog.last_train["loss"], tok_s=prog.last_train["tok_per_s"])
                log.info("step %d %s, %.1f min", prog.step, json.dumps(prog.last_train), prog.elapsed / 60)
                window = {"loss": 0.0, "nll": 0.0, "n": 0, "tok": 0, "t": 0.0}
            if prog.elapsed - last_ckpt >= cfg.checkpoint_minutes * 60 and not _budget_spent(cfg, prog):
                t1 = time.perf_counter()
                _save_state(ckpt, cfg, prep, model, optimizer, scheduler, prog)
                # checkpoints (dev loss, writing) count against the budget too: it is wall clock
                prog.elapsed += time.perf_counter() - t1
                last_ckpt = prog.elapsed
    except KeyboardInterrupt:
        bar.close()
        log.warning("interrupted at step %d: saving a checkpoint to resume from", prog.step)
        _save_state(ckpt, cfg, prep, model, optimizer, scheduler, prog)
        raise
    bar.close()
    if not prog.history or prog.history[-1]["step"] != prog.step:  # else the session had nothing left to do
        _save_state(ckpt, cfg, prep, model, optimizer, scheduler, prog)


def train_demo(cfg: TrainConfig) -> TrainResult:
    """Train (or resume), then save the fp16 model, tokenizer and model card to ``cfg.out``."""
    from transformers import M2M100ForConditionalGeneration

    cfg = cfg.resolved()
    torch.set_num_threads(cfg.threads)
    # Adam's second moments of rarely seen embedding rows decay into denormals, which are very slow on x86
    torch.set_flush_denormal(True)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = cfg.work_dir / CHECKPOINT
    ckpt = load_checkpoint(ckpt_path) if cfg.resume and ckpt_path.exists() else None
    if ckpt is not None and ckpt["arch"] != cfg.arch:
        raise ValueError(f"checkpoint {ckpt_path} has architecture {ckpt['arch']}, not {cfg.arch}")
    prep = prepare(cfg)
    if ckpt is not None and ckpt["directions"] != prep.directions:
        raise ValueError(f"checkpoint {ckpt_path} was trained on {ckpt['directions']}, not {prep.directions}")

    torch.manual_seed(cfg.seed)
    config = model_config(cfg.arch, prep.tokenizer, dropout=cfg.dropout)  # type: ignore[arg-type]
    model = M2M100ForConditionalGeneration(config)
    model.to(cfg.device)  # type: ignore[arg-type]
    params = count_parameters(model)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,  # type: ignore[arg-type]
        betas=(0.9, 0.98),
        eps=1e-8,
        weight_decay=cfg.weight_decay,
        fused=True,  # one kernel over all parameters: ~5x faster than the foreach path on CPU
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt(cfg.warmup))  # type: ignore[arg-type]
    prog = _Progress()
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        prep.stream.load_state_dict(ckpt["sampler"])
        _set_rng_state(ckpt["rng"])
        prog = _Progress(**ckpt["progress"])
        # the schedule's peak comes from this session's --lr (the checkpoint holds the previous one)
        scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]  # type: ignore[misc]
        for group in optimizer.param_groups:
            group["initial_lr"] = cfg.lr
            group["lr"] = cfg.lr * inverse_sqrt(cfg.warmup)(prog.step)  # type: ignore[arg-type, operator]
        log.info("resumed from %s at step %d (%.1f min trained)", ckpt_path, prog.step, prog.elapsed / 60)
    del ckpt
    # one entry per session: a resumed run may change the budget or the recipe, and the model card says so
    prog.sessions.append(
        {"start_step": prog.step, "start_minutes": round(prog.elapsed / 60, 2), "command": cfg.command}
        | {k: getattr(cfg, k) for k in ("max_minutes", "max_steps", *_HYPERPARAMETERS)}
    )
    log.info(
        "model: %s, %.2fM parameters, vocabulary %d, device %s, batch %d tokens, budget %s min / %s steps",
        cfg.arch,
        params / 1e6,
        model.config.vocab_size,
        cfg.device,
        cfg.batch_tokens,
        cfg.max_minutes,
        cfg.max_steps,
    )
    with _sigterm_as_interrupt():
        _train_loop(cfg, prep, model, optimizer, scheduler, prog, ckpt_path)
    del optimizer
    summary = save_and_evaluate(cfg, prep, model, prog, params)
    return TrainResult(
        cfg.out,
        prog.step,
        prog.tokens,
        prog.elapsed / 60,
        params,
        summary["dev"],
        prog.history,
        prog.train_log,
    )


def save_and_evaluate(cfg: TrainConfig, prep: Prepared, model, prog: _Progress, params: int) -> dict:
    """Save fp16 weights + tokenizer, reload the folder like a user would, score dev, write the model card."""
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    tok = prep.tokenizer
    model.eval().half()
    gen = model.generation_config
    gen.decoder_start_token_id = tok.eos_token_id  # type: ignore[attr-defined]
    gen.num_beams, gen.max_length = 1, cfg.max_len
    # The tokenizer knows all 100 M2M100 codes; record the ones trained, so others are refused at load.
    model.config.fastvocab_languages = sorted(prep.langs)
    model.save_pretrained(out)
    tok.src_lang = prep.langs[0]  # type: ignore[attr-defined]
    tok.tgt_lang = prep.langs[1] if len(prep.langs) > 1 else prep.langs[0]  # type: ignore[attr-defined]
    tok.save_pretrained(out)  # type: ignore[attr-defined]

    reloaded, rtok = load_saved_model(out, cfg.device)
    if reloaded.get_output_embeddings().bias is not None:
        raise RuntimeError(f"the model saved to {out} has an output bias; the demo model must have none")
    dev_text = load_parallel(cfg.corpus, prep.directions, "dev", limit=cfg.dev_sentences)
    dev_scores = {}
    for d in prep.directions:
        src, ref = dev_text[d]
        t0 = time.perf_counter()
        hyp = translate(
            reloaded,
            rtok,
            src,
            *parse_direction(d),
            batch_size=cfg.eval_batch_size,
            max_len=cfg.max_len,
            device=cfg.device,
        )
        dev_scores[d] = score(hyp, ref) | {"seconds": round(time.perf_counter() - t0, 1)}
        log.info(
            "dev %s: BLEU %.2f chrF %.2f (%d sentences)",
            d,
            dev_scores[d]["bleu"],
            dev_scores[d]["chrf"],
            len(src),
        )

    summary = {
        "fastvocab_version": __version__,
        "preset": cfg.preset if cfg.arch == PRESETS.get(cfg.preset) else "custom",
        "arch": cfg.arch,
        "vocab_size": reloaded.config.vocab_size,
        "params": params,
        "steps": prog.step,
        "train_tokens": prog.tokens,
        "train_minutes": round(prog.elapsed / 60, 2),
        "device": describe_device(cfg.device, cfg.threads),
        "directions": prep.directions,
        "train_pairs": prep.train_pairs,
        "dropped_longer_than_max_len": prep.dropped,
        "sampling_probs": {
            d: round(float(p), 4) for d, p in zip(prep.stream.directions, prep.stream.probs, strict=True)
        },
        "hyperparameters": {k: getattr(cfg, k) for k in _HYPERPARAMETERS},
        "dev": dev_scores,
        "history": prog.history,
        "sessions": prog.sessions,
        "command": cfg.command,
    }
    (out / "training_summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    (out / "README.md").write_text(model_card(summary), encoding="utf-8")
    return summary


_HYPERPARAMETERS = (
    "batch_tokens",
    "lr",
    "warmup",
    "dropout",
    "seed",
    "label_smoothing",
    "weight_decay",
    "clip_norm",
    "max_len",
    "temperature",
    "spm_sentences",
)


def describe_device(device: str, threads: int) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__})"


# -------------------------------------------------------------------------------------------- model card


def _score_table(scores: dict[str, dict]) -> list[str]:
    rows = ["| direction | sentences | BLEU | chrF |", "| --- | ---: | ---: | ---: |"]
    rows += [f"| {d} | {x['sentences']} | {x['bleu']:.1f} | {x['chrf']:.1f} |" for d, x in scores.items()]
    return rows


def _sessions_section(sessions: list[dict]) -> list[str]:
    """A table of the training sessions when the run was resumed with another budget or recipe."""
    if len(sessions) < 2:
        return []
    keys = ["batch_tokens", "lr", "warmup", "dropout", "temperature", "max_minutes", "max_steps", "note"]
    rows = [
        "The run was resumed from its checkpoint; each session's budget and recipe (the table above shows "
        "the last):",
        "",
        "| from step | from minute | " + " | ".join(keys) + " |",
        "| ---: | ---: | " + " | ".join("---" for _ in keys) + " |",
    ]
    for x in sessions:
        rows.append(
            f"| {x['start_step']} | {x['start_minutes']} | "
            + " | ".join(str(x.get(k, "")) for k in keys)
            + " |"
        )
    rows += ["", "Commands, one per session:", "", "```bash"]
    rows += [x.get("command") or "(library call)" for x in sessions]
    return [*rows, "```", ""]


def model_card(summary: dict) -> str:
    """The model card (README.md of the model folder) from a training summary."""
    arch, hp, dev = summary["arch"], summary["hyperparameters"], summary["dev"]
    sig: dict = next(iter(dev.values()), {})
    langs = sorted({lang for d in summary["directions"] for lang in parse_direction(d)})
    data_rows = [
        f"| {d} | {summary['train_pairs'][d]:,} | {summary['dropped_longer_than_max_len'][d]:,} "
        f"| {summary['sampling_probs'][d]:.3f} |"
        for d in summary["directions"]
    ]
    hist_rows = [
        f"| {h['step']} | {h['minutes']:.1f} | {h.get('loss', float('nan')):.3f} | "
        f"{h.get('nll', float('nan')):.3f} | {h['dev_nll']:.3f} | {h.get('tok_per_s', 0)} |"
        for h in summary["history"]
    ]
    lines = [
        "---",
        f"language: [{', '.join(langs)}]",
        "license: apache-2.0",
        "library_name: transformers",
        "pipeline_tag: translation",
        "tags: [m2m_100, fastvocab, demo]",
        "---",
        "",
        "# fastvocab demo model (M2M100 architecture, trained from scratch)",
        "",
        "A small many-to-many translation model for trying fastvocab's clustered vocabulary projection: a "
        f"shared {summary['vocab_size']:,}-entry vocabulary (SentencePiece unigram + M2M100 language tags) "
        "and a lean decoder, so the output projection is a large share of each decoding step, as in the "
        "large multilingual models the method is for. It is a demo, not a production translator: small, "
        "trained "
        "briefly on software package descriptions.",
        "",
        "Load it offline with the standard classes (the weights are fp16; use float32 on CPU):",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("models/demo")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("models/demo", dtype=torch.float32)',
        'tok.src_lang = "en"',
        'batch = tok(["a library for network graphics"], return_tensors="pt")',
        'out = model.generate(**batch, forced_bos_token_id=tok.get_lang_id("it"))',
        "print(tok.batch_decode(out, skip_special_tokens=True))",
        "```",
        "",
        "or `fastvocab translate --model models/demo --src-lang en --tgt-lang it -i in.txt -o out.txt`.",
        "",
        *([f"**Status:** {summary['status']}", ""] if summary.get("status") else []),
        "## Model",
        "",
        "| | |",
        "| --- | --- |",
        "| architecture | M2M100 (`M2M100ForConditionalGeneration`), pre-norm, sinusoidal positions |",
        f"| preset | `{summary['preset']}` |",
        f"| d_model / FFN / heads | {arch['d_model']} / {arch['ffn']} / {arch['heads']} |",
        f"| encoder / decoder layers | {arch['enc_layers']} / {arch['dec_layers']} |",
        f"| vocabulary | {summary['vocab_size']:,} (SentencePiece {arch['vocab']:,} + language tags) |",
        "| output layer | tied to the shared embeddings, **no bias** |",
        f"| parameters | {summary['params'] / 1e6:.2f}M |",
        "| weights | fp16 safetensors |",
        "",
        "Sequences follow M2M100: encoder input `__src__ tokens </s>`, the decoder starts with `</s>`, and "
        "the target-language tag `__tgt__` is forced as the first generated token (`forced_bos_token_id`).",
        "",
        "## Data",
        "",
        "Debian package description translations (the corpus built by `fastvocab corpus`), both directions "
        f"of every language pair; pairs longer than {hp['max_len']} tokens on either side are dropped.",
        "",
        "| direction | train pairs | dropped (too long) | sampling probability |",
        "| --- | ---: | ---: | ---: |",
        *data_rows,
        "",
        f"Directions are mixed in every batch by temperature sampling (T={hp['temperature']}: p(d) ~ "
        "n(d)^(1/T)), so the small pairs are upsampled.",
        "",
        "## Training",
        "",
        "| | |",
        "| --- | --- |",
        f"| steps | {summary['steps']:,} |",
        f"| tokens seen (source + target, no padding) | {summary['train_tokens']:,} |",
        f"| training wall time | {summary['train_minutes']:.1f} min |",
        f"| device | {summary['device']} |",
        f"| batch | up to {hp['batch_tokens']:,} padded tokens per side, length-bucketed |",
        f"| optimizer | AdamW (0.9, 0.98), weight decay {hp['weight_decay']}, clip norm {hp['clip_norm']} |",
        f"| schedule | inverse square root, peak lr {hp['lr']} after {hp['warmup']} warmup steps |",
        f"| loss | cross-entropy, label smoothing {hp['label_smoothing']} |",
        f"| dropout | {hp['dropout']} |",
        f"| seed | {hp['seed']} |",
        "",
        "Command (of the last session when the run was resumed):",
        "",
        "```bash",
        summary["command"] or "(library call: fastvocab.tasks.train_demo.train_demo)",
        "```",
        "",
        *_sessions_section(summary.get("sessions", [])),
        "Training log, one row per checkpoint (train figures: mean over the last logging window):",
        "",
        "| step | minutes | train loss | train nll | dev nll | tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        *hist_rows,
        "",
        f"## Dev scores (greedy `model.generate`, first {sig.get('sentences', 0)} dev pairs per direction)",
        "",
        *_score_table(dev),
        "",
        f"BLEU: `{sig.get('bleu_signature', '')}`; chrF: `{sig.get('chrf_signature', '')}`.",
        "",
        TEST_SCORES_MARKER,
        "",
    ]
    return "\n".join(lines)


TEST_SCORES_MARKER = "<!-- test-scores -->"

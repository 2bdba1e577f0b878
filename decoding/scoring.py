"""Forced decoding: the score the full model gives a fixed output, for search-error measurements.

Hoang et al. (2022) count a *search error* when the output of an approximate method scores lower under the
full model than the full-softmax output. :func:`sequence_scores` gives that score for any token sequences:
the prefix (decoder start, target tag) is fed as the search feeds it, then each token; the log-probabilities
of the tokens (and of EOS, when the output ended with it) come from the full projection ``h W^T + b`` with
a log-softmax over all N columns, as ``beam_search`` reads them. Only the adapter's ``encode`` /
``decoder_step`` and the full projection are used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastvocab.kernels.base import Projection


@torch.inference_mode()
def sequence_log_probs(
    adapter,
    full: Projection,
    batch: dict,
    tgt_lang: str,
    outputs: Sequence[Sequence[int]],
    *,
    ended: Sequence[bool] | None = None,
) -> list[float]:
    """Sum of log p(token) under the full model for each output of a batch (from ``adapter.encode_texts``).

    ``outputs`` are the searches' token lists (prefix and EOS excluded); ``ended[i]`` says output ``i``
    stopped with EOS, whose log-probability is then included (default: all ended). The forced target tag
    counts log-probability 0, as with ``forced_bos_token_id``.
    """
    n = batch["input_ids"].shape[0]
    if len(outputs) != n:
        raise ValueError(f"{len(outputs)} outputs for a batch of {n} sentences")
    ended = [True] * n if ended is None else list(ended)
    eos = adapter.eos_id
    seqs = [list(map(int, s)) + ([eos] if e else []) for s, e in zip(outputs, ended, strict=True)]
    steps = max((len(s) for s in seqs), default=0)
    device = adapter.device
    # (n, steps) targets, EOS-padded; the mask keeps each sentence's own positions.
    targets = torch.full((n, max(steps, 1)), eos, dtype=torch.long, device=device)
    mask = torch.zeros((n, max(steps, 1)), dtype=torch.bool, device=device)
    for i, s in enumerate(seqs):
        targets[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = True
    totals = torch.zeros(n, dtype=torch.float64, device=device)
    state = adapter.encode(batch)
    h = None
    for tok in adapter.start_tokens(tgt_lang):
        h, state = adapter.decoder_step(torch.full((n,), tok, dtype=torch.long, device=device), state)
    assert h is not None  # start_tokens is never empty (the forced prefix)
    for t in range(steps):
        logp = full(h).log_probs()  # (n, N) float32
        picked = logp.gather(1, targets[:, t : t + 1])[:, 0]  # (n,)
        totals += torch.where(mask[:, t], picked, torch.zeros_like(picked)).double()
        if t + 1 < steps:
            h, state = adapter.decoder_step(targets[:, t], state)
    return totals.tolist()


def normalised_score(
    log_prob: float, tokens: int, ended: bool, prefix_len: int, length_penalty: float
) -> float:
    """Beam search's hypothesis score ``sum(log p) / length ** length_penalty``.

    ``length`` counts what ``generate`` counts: the forced tag (``prefix_len - 1``: the decoder start is not
    generated), the tokens and EOS when the output ended with it.
    """
    length = (prefix_len - 1) + tokens + (1 if ended else 0)
    return log_prob / (float(max(length, 1)) ** length_penalty)


def sequence_scores(
    adapter,
    full: Projection,
    batch: dict,
    tgt_lang: str,
    outputs: Sequence[Sequence[int]],
    *,
    length_penalty: float = 1.0,
    ended: Sequence[bool] | None = None,
) -> list[float]:
    """Length-normalised full-model scores of ``outputs`` (see :func:`sequence_log_probs`)."""
    ended = [True] * len(outputs) if ended is None else list(ended)
    logps = sequence_log_probs(adapter, full, batch, tgt_lang, outputs, ended=ended)
    prefix_len = len(adapter.start_tokens(tgt_lang))
    return [
        normalised_score(lp, len(s), e, prefix_len, length_penalty)
        for lp, s, e in zip(logps, outputs, ended, strict=True)
    ]

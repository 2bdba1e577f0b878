"""Each row's best continuations for beam search from a projection's output (:func:`row_candidates`): torch's
log-softmax and top-k, or on CPU one compiled call (``host_beam_step.row_candidates``, where
``switches.COMPILED_CANDIDATES``); and the forced EOS at the length limit (:func:`forced_candidates`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fastvocab import switches
from fastvocab.decoding.beam_kernels import compiled_step
from fastvocab.kernels.base import ProjectionOutput
from fastvocab.kernels.rowwise import topk_rows

_NO_IDS = np.empty(0, dtype=np.int64)
_NO_MASS = np.empty(0, dtype=np.float32)


def row_candidates(
    out: ProjectionOutput,
    banned: torch.Tensor | None,
    k: int,
    first: bool = False,
    topk: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] = topk_rows,
    spend: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's best ``2k`` continuations (log-probs, vocabulary ids) from a projection's output, the
    ``banned`` ids at -inf after the log-softmax (as generate's processors): a sentence's best ``2k`` over
    its ``k`` rows lie within them. ``first``: the rows are one per sentence (the first step), copied to its
    ``k`` beams. ``topk``: the per-row top-k (the CPU's blocked one; ``torch.topk`` gives the same values).
    ``spend``: nothing reads ``out`` after (:meth:`ProjectionOutput.search_scores`).

    On CPU (float32, one id per column), the normaliser, the banned ids and the top-k are one compiled call
    (``host_beam_step.row_candidates``) that reads the logits and writes nothing over them."""
    if topk is topk_rows and _host_can(out):
        return _host_candidates(out, banned, k, first)
    logp = out.search_scores(banned, log_probs=True, spend=spend)  # (rows, C)
    vals, cols = topk(logp, min(2 * k, logp.shape[1]))
    toks = out.to_vocab_ids(cols)
    if first:
        return vals.repeat_interleave(k, 0), toks.repeat_interleave(k, 0)
    return vals, toks


def _host_can(out: ProjectionOutput) -> bool:
    logits = out.logits
    return (
        switches.COMPILED_CANDIDATES.get() and logits.device.type == "cpu" and logits.dtype == torch.float32
        and (out.ids is None or out.ids.dim() == 1) and not logits.requires_grad
    )  # fmt: skip


def _host_candidates(
    out: ProjectionOutput, banned: torch.Tensor | None, k: int, first: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`row_candidates` as one compiled call on the output's CPU memory."""
    rows, cols = out.logits.shape
    m, copies = min(2 * k, cols), k if first else 1
    vals = np.empty((rows * copies, m), dtype=np.float32)
    toks = np.empty((rows * copies, m), dtype=np.int64)
    ids = _NO_IDS if out.ids is None else out.ids.numpy()
    mass = _NO_MASS if out.log_inactive_mass is None else out.log_inactive_mass.float().numpy()
    banned_ids = _NO_IDS if banned is None else np.sort(banned.numpy())
    compiled_step().row_candidates(out.logits.numpy(), ids, mass, banned_ids, m, copies, vals, toks)
    return torch.from_numpy(vals), torch.from_numpy(toks)


def forced_candidates(rows: int, token: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """generate's ``forced_eos_token_id`` at the length limit: ``token`` gets log-prob 0, all else -inf."""
    return torch.zeros((rows, 1), device=device), torch.full(
        (rows, 1), token, dtype=torch.long, device=device
    )

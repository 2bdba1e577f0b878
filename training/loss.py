"""The training objective: label-smoothed cross-entropy through the tied LM head, computed in row chunks on
CPU (``seq2seq_loss``), and the dev-set token nll scored at every checkpoint (``dev_loss``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from fastvocab.training.batches import collate
from fastvocab.training.data import Encoded

if TYPE_CHECKING:
    from transformers import M2M100ForConditionalGeneration


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
        loss_sum = torch.zeros((), dtype=torch.float64, device=h.device)
        nll_sum = torch.zeros((), dtype=torch.float64, device=h.device)
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
            g[torch.arange(len(tc), device=h.device), tc] -= 1.0 - smoothing
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
    model: M2M100ForConditionalGeneration,
    batch: dict[str, torch.Tensor],
    pad_id: int,
    label_smoothing: float,
    chunk: int | None = 1024,
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
def dev_loss(
    model: M2M100ForConditionalGeneration,
    data: list[Encoded],
    pad_id: int,
    decoder_start_id: int,
    batch_tokens: int,
) -> float:
    """Mean token nll of the dev pairs (no smoothing, no dropout)."""
    was_training = model.training
    model.eval()
    pairs = [(k, i) for k, e in enumerate(data) for i in range(len(e.src))]
    pairs.sort(key=lambda p: max(len(data[p[0]].src[p[1]]), len(data[p[0]].tgt[p[1]])))
    device = next(model.parameters()).device
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
        batch = {k: v.to(device) for k, v in batch.items()}
        _, nll, ntok = seq2seq_loss(model, batch, pad_id, 0.0)
        total, n = total + float(nll) * ntok, n + ntok
        start = end
    model.train(was_training)
    return total / max(n, 1)

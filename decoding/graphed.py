"""Greedy and beam search with the whole decoding step in CUDA graphs (issue 16, item 3).

Eager decoding on a GPU launches a few hundred small kernels per step from Python, and at small batch that,
not the arithmetic, is the step's cost. Here one step (the token choice, the search's bookkeeping and the
static engine's fixed-shape decoder step, :meth:`~fastvocab.decoding.engine.StaticDecoder.step_fixed`) is
captured once per batch and replayed, with nothing read back to the host except the stop check every
``SYNC_EVERY`` steps (``fastvocab.decoding.search``'s schedule). Rows that finish stay in the batch (no
compaction: a new row count would need a new graph), and keep emitting EOS.

The token choice must not read the host either, so only projections with a capturable choice run here
(:func:`graph_pick`): the full projection (argmax over N) and the static-capacity union
(``kernels.clustered_static.StaticUnion``; today's union mode reads its column count back every step). A
union that outgrows the static capacity sets a device flag; read at the next host read, it sends the batch
to the eager search, where such a step gets the full logits: a column is never dropped silently.

Beam search (:func:`beam_search_graphed`) keeps every sentence in the batch too: its state is
:class:`Beams` (fixed shapes, the finished hypotheses of a done sentence frozen), its scores come from
:func:`graph_scores` (the same two projections), and its cache reorder gathers the whole self-attention
capacity from one buffer into the other. So it captures two graphs, A -> B and B -> A, and replays them in
turn; the first step (one row per sentence, as the eager search scores it) and the last (every candidate
finishes) run eagerly.

Without CUDA (or with ``capture=False``) the same steps run eagerly: that is how the CPU tests check that
the outputs equal :func:`~fastvocab.decoding.search.greedy_search`'s and
:func:`~fastvocab.decoding.search.beam_search`'s, hence ``generate``'s. Not yet the default on CUDA:
``tests/gpu/test_engine_graph.py`` and the GPU campaign check them first.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from fastvocab.decoding import search
from fastvocab.decoding.rowwise import topk_rows
from fastvocab.kernels.base import Projection

log = logging.getLogger(__name__)

Pick = Callable[[torch.Tensor], torch.Tensor]  # h (rows, d) -> greedy token ids (rows,), no host read


def graph_pick(
    projection: object, banned: torch.Tensor | None = None, overflow: torch.Tensor | None = None
) -> Pick | None:
    """The greedy choice of ``projection`` as a capturable function, or None when it has none.

    ``banned``: vocabulary ids never chosen (the search's suppressed ids). ``overflow``: a 0-d bool device
    tensor that a static-capacity union ORs with "this step's union did not fit" (its choice is then not to
    be trusted; the caller reads the flag at its next host read).
    """
    from fastvocab.kernels.clustered_static import StaticUnion
    from fastvocab.kernels.full import FullProjection

    if isinstance(projection, FullProjection):

        def pick_full(h: torch.Tensor) -> torch.Tensor:
            logits = projection(h).logits
            if banned is not None:
                logits = logits.index_fill(1, banned, -math.inf)
            return logits.argmax(dim=1)

        return pick_full
    if isinstance(projection, StaticUnion):

        def pick_union(h: torch.Tensor) -> torch.Tensor:
            out = projection.step(h, overflow)
            logits = out.logits
            if banned is not None:
                logits = logits.masked_fill(torch.isin(out.ids, banned)[None, :], -math.inf)
            return out.ids[logits.argmax(dim=1)]

        return pick_union
    return None


def capture_graph(fn: Callable[[], object], warmups: int = 1) -> Callable[[], None]:
    """``fn`` run ``warmups`` times on a side stream (lazy inits, cuBLAS handles: as ``torch.cuda.graph``
    asks), then captured in a CUDA graph; returns the graph's ``replay``. The warm-up runs are real: the
    caller restores what they changed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


@torch.inference_mode()
def greedy_search_graphed(
    adapter,
    projection: Projection | object,
    batch: dict,
    src_lang: str,
    tgt_lang: str,
    max_len: int = 128,
    capture: bool | None = None,
) -> list[list[int]]:
    """Greedy decoding of a batch, like :func:`~fastvocab.decoding.search.greedy_search` (same outputs), with
    the step captured in a CUDA graph (``capture``: None = when the model is on CUDA)."""
    search._check(adapter, src_lang, tgt_lang, max_len)
    dec = adapter.static_decoder
    if dec is None:
        raise ValueError("graphed greedy search needs the static engine (engine='static')")
    overflow = torch.zeros((), dtype=torch.bool, device=adapter.device)
    pick = graph_pick(projection, search._banned_ids(adapter, adapter.device), overflow)
    if pick is None:
        raise ValueError(
            f"{type(projection).__name__} has no capturable token choice: use the full projection or a "
            "static-capacity union (kernels.clustered_static.StaticUnion)"
        )
    n = batch["input_ids"].shape[0]
    if n == 0:
        return []
    device = adapter.device
    capture = device.type == "cuda" if capture is None else capture
    eos = adapter.eos_id
    forced_eos = getattr(adapter, "forced_eos_id", None)
    h, state, _ = search._start(adapter, batch, tgt_lang, max_len)
    cache = state.cache
    last = max_len - 1  # the step whose token is never fed back
    if last > 0:
        dec.prepare_fixed(cache, cache.length + last - 1)

    h_buf = h.clone()  # (rows, d) the state the next choice reads
    out_tokens = torch.full((n, max_len), eos, dtype=torch.long, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    pos = torch.full((1,), cache.length, dtype=torch.long, device=device)  # next decoder position
    step_t = torch.zeros(1, dtype=torch.long, device=device)  # next column of out_tokens

    def choose() -> torch.Tensor:
        tokens = pick(h_buf).masked_fill(finished, eos)  # a finished row keeps emitting EOS
        out_tokens.index_copy_(1, step_t, tokens[:, None])
        finished.logical_or_(tokens == eos)
        step_t.add_(1)
        return tokens

    def body() -> None:
        h_buf.copy_(dec.step_fixed(choose(), cache, pos))
        pos.add_(1)

    replay = body
    if capture and last > 0:
        saved = (h_buf.clone(), out_tokens.clone(), finished.clone(), cache.self_kv.clone())
        replay = capture_graph(body)
        # The warm-up ran one real step: put every buffer back (capture itself runs nothing).
        overflow.zero_()
        h_buf.copy_(saved[0])
        out_tokens.copy_(saved[1])
        finished.copy_(saved[2])
        cache.self_kv.copy_(saved[3])
        pos.fill_(cache.length)
        step_t.zero_()

    sync_every = search._sync_every(device, None)
    for step in range(last):
        replay()
        cache.length += 1
        if (step + 1) % sync_every == 0 and bool(finished.all() | overflow):  # the host read
            break
    else:
        if forced_eos is not None:  # generate's forced_eos_token_id at the length limit
            tokens = torch.full((n,), forced_eos, dtype=torch.long, device=device).masked_fill(finished, eos)
            out_tokens[:, last] = tokens
        else:
            choose()
    if bool(overflow):
        # A union outgrew the static capacity: never serve a choice made without all its columns. The batch
        # is decoded again eagerly, where an overflowing step gets the full logits (StaticUnion.project).
        log.info(
            "graphed greedy: a union outgrew capacity %d; batch decoded again eagerly", projection.capacity
        )
        return search.greedy_search(adapter, projection.project, batch, src_lang, tgt_lang, max_len=max_len)
    return [search._strip(row, eos) for row in out_tokens.tolist()]


# ----------------------------------------------------------------------------------------------- beam search

Scores = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def graph_scores(
    projection: object, banned: torch.Tensor | None = None, overflow: torch.Tensor | None = None
) -> Scores | None:
    """Beam search's per-step scores of ``projection`` as a capturable function, or None when it has none:
    ``h (rows, d) -> (log-probs (rows, C) float32, vocabulary ids (C,) of the columns, None for all N)``,
    the ``banned`` ids at ``-inf`` after the log-softmax (as the eager search and ``generate`` apply them).
    ``overflow`` as in :func:`graph_pick`."""
    from fastvocab.kernels.clustered_static import StaticUnion
    from fastvocab.kernels.full import FullProjection

    if isinstance(projection, FullProjection):

        def scores_full(h: torch.Tensor) -> tuple[torch.Tensor, None]:
            logp = torch.log_softmax(projection(h).logits.float(), dim=-1)
            return (logp if banned is None else logp.index_fill(1, banned, -math.inf)), None

        return scores_full
    if isinstance(projection, StaticUnion):

        def scores_union(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = projection.step(h, overflow)
            logp = torch.log_softmax(out.logits.float(), dim=-1)  # padded columns are -inf: weight 0
            if banned is not None:
                logp = logp.masked_fill(torch.isin(out.ids, banned)[None, :], -math.inf)
            return logp, out.ids

        return scores_union
    return None


class Beams:
    """The fixed-shape state of a beam search over ``n`` sentences x ``k`` beams, and its step
    (:meth:`choose`), which reads nothing back to the host: what :func:`beam_search_graphed` captures.

    Mirrors :func:`~fastvocab.decoding.search.beam_search` step for step (the same candidates, finished
    pool, stopping rule and float32 arithmetic), except that sentences never leave: a sentence found done
    keeps its finished hypotheses frozen, as the eager search freezes them between host reads.
    ``row_topk`` is the per-row top-k (the eager search's; ``torch.topk`` on an accelerator).
    """

    def __init__(
        self,
        n: int,
        k: int,
        max_len: int,
        prefix_len: int,
        length_penalty: float,
        rule: bool | str,
        eos: int,
        forced_eos: int | None,
        scores: Scores,
        device: torch.device,
        row_topk: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] = topk_rows,
    ) -> None:
        self.n, self.k, self.max_len, self.rule = n, k, max_len, rule
        self.eos, self.forced_eos, self.scores, self.row_topk = eos, forced_eos, scores, row_topk
        self.lp, self.device, neg = length_penalty, device, search._NEG
        self.run_scores = torch.full((n, k), neg, device=device)  # cumulative log-prob of the live beams
        self.run_scores[:, 0] = 0.0  # identical beams at the start: only the first one may expand
        self.run_seqs = torch.full((n, k, max_len), eos, dtype=torch.long, device=device)
        self.fin_scores = torch.full((n, k), neg, device=device)  # normalised scores of finished hyps
        self.fin_seqs = torch.full((n, k, max_len), eos, dtype=torch.long, device=device)
        self.fin_any = torch.zeros((n, k), dtype=torch.bool, device=device)  # the slot holds a real one
        self.done = torch.zeros(n, dtype=torch.bool, device=device)  # finished hypotheses frozen
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # the column of the sequences
        self.top_k_mask = torch.arange(2 * k, device=device) < k  # only the best k candidates may finish
        self.sent_rows = torch.arange(n, device=device)[:, None] * k  # (n, 1) first row of each sentence
        # length ** length_penalty by step, rounded to float32 from the double the eager search divides by
        self.denoms = torch.tensor(
            [float(prefix_len + s) ** length_penalty for s in range(max_len)], device=device
        )
        self.never_len = float(prefix_len + max_len - 1) ** length_penalty  # "never": judged at the limit

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """What :meth:`choose` changes (to save and restore around a graph's warm-up)."""
        return (self.run_scores, self.run_seqs, self.fin_scores, self.fin_seqs, self.fin_any, self.done,
                self.step)  # fmt: skip

    def choose(
        self, h: torch.Tensor, final: bool = False, first: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on the states ``h`` (n*k, d): returns the tokens (n*k,) and the row each continues.
        ``final``: the length limit (every candidate finishes); ``first``: a sentence's k rows are one
        state yet, scored once (the eager search's first step)."""
        n, k, k2, neg, t = self.n, self.k, 2 * self.k, search._NEG, self.max_len
        if final and self.forced_eos is not None:  # generate's forced_eos_token_id at the length limit
            kk = 1
            row_vals = torch.zeros((n * k, 1), device=self.device)
            row_toks = torch.full((n * k, 1), self.forced_eos, dtype=torch.long, device=self.device)
        else:
            logp, ids = self.scores(h[::k].contiguous() if first else h)
            kk = min(k2, logp.shape[1])
            row_vals, row_cols = self.row_topk(logp, kk)  # (rows, kk)
            row_toks = row_cols if ids is None else ids[row_cols]
            if first:
                row_vals, row_toks = row_vals.repeat_interleave(k, 0), row_toks.repeat_interleave(k, 0)
        total = (row_vals.view(n, k, kk) + self.run_scores[:, :, None]).view(n, k * kk)
        cand_scores, flat = torch.topk(total, min(k2, k * kk), dim=-1)  # (n, k2)
        cand_beam = flat // kk
        cand_toks = row_toks.view(n, k * kk).gather(1, flat)
        cand_seqs = self.run_seqs.gather(1, cand_beam[:, :, None].expand(-1, -1, t)).clone()
        cand_seqs.index_copy_(2, self.step, cand_toks[:, :, None])
        done_cand = torch.ones_like(cand_toks, dtype=torch.bool) if final else cand_toks == self.eos
        new_fin = done_cand & self.top_k_mask[: cand_toks.shape[1]] & ~self.done[:, None]
        denom = self.denoms.index_select(0, self.step)  # (1,) (tokens incl. the tag) ** length_penalty
        norm = cand_scores / denom + (~new_fin).to(cand_scores.dtype) * neg
        m_scores, sel = torch.topk(torch.cat([self.fin_scores, norm], dim=1), k, dim=1)
        m_seqs = torch.cat([self.fin_seqs, cand_seqs], dim=1)
        self.fin_seqs.copy_(m_seqs.gather(1, sel[:, :, None].expand(-1, -1, t)))
        self.fin_any.copy_(torch.cat([self.fin_any, new_fin], dim=1).gather(1, sel))
        self.fin_scores.copy_(m_scores)
        live, pick = torch.topk(cand_scores + done_cand.to(cand_scores.dtype) * neg, k, dim=1)
        self.run_scores.copy_(live)
        self.run_seqs.copy_(cand_seqs.gather(1, pick[:, :, None].expand(-1, -1, t)))
        now = self.fin_any.all(dim=1)
        if self.rule is not True:  # generate's heuristic: the best live beam cannot beat the worst finished
            never = self.rule == "never" and self.lp > 0
            best = self.run_scores[:, 0] / (self.never_len if never else denom)
            now &= best <= self.fin_scores.min(dim=1).values
        self.done.logical_or_(now)
        self.step.add_(1)
        rows = self.sent_rows + cand_beam.gather(1, pick)  # (n, k)
        return cand_toks.gather(1, pick).reshape(-1), rows.reshape(-1)


@torch.inference_mode()
def beam_search_graphed(
    adapter,
    projection: Projection | object,
    batch: dict,
    src_lang: str,
    tgt_lang: str,
    beam: int = 4,
    max_len: int = 128,
    length_penalty: float = 1.0,
    early_stopping: bool | str | None = None,
    capture: bool | None = None,
) -> list[list[int]]:
    """Beam search of a batch, like :func:`~fastvocab.decoding.search.beam_search` (same outputs), with the
    step (scores, the search's choice, the cache reorder, the decoder step) in CUDA graphs (``capture``:
    None = when the model is on CUDA). ``early_stopping``: None = the model's rule, as there.

    Every shape is fixed for the batch: sentences that are done stay in it (their finished hypotheses
    frozen, as the eager search freezes them between host reads) until all are done, read every
    ``SYNC_EVERY`` steps. The reorder gathers the whole self-attention capacity from one buffer into the
    other, so two graphs are captured, one per direction, and replayed in turn (no copy back). The last
    step (every candidate finishes there) runs eagerly.
    """
    search._check(adapter, src_lang, tgt_lang, max_len)
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    rule = search.stopping_rule(adapter, early_stopping)
    dec = adapter.static_decoder
    if dec is None:
        raise ValueError("graphed beam search needs the static engine (engine='static')")
    device = adapter.device
    overflow = torch.zeros((), dtype=torch.bool, device=device)
    scores = graph_scores(projection, search._banned_ids(adapter, device), overflow)
    if scores is None:
        raise ValueError(
            f"{type(projection).__name__} has no capturable scores: use the full projection or a "
            "static-capacity union (kernels.clustered_static.StaticUnion)"
        )
    n = batch["input_ids"].shape[0]
    if n == 0:
        return []
    capture = device.type == "cuda" if capture is None else capture
    eos, forced_eos = adapter.eos_id, getattr(adapter, "forced_eos_id", None)
    k = beam

    h, state, prefix_len = search._start(adapter, batch, tgt_lang, max_len)
    state = adapter.reorder(state, torch.arange(n, device=device).repeat_interleave(k), group=k)
    cache = state.cache
    last = max_len - 1  # the step whose tokens are never fed back (run eagerly below)
    if last > 0:
        dec.prepare_fixed(cache, cache.length + last - 1)
    buffers = (cache.self_kv.contiguous(), torch.empty_like(cache.self_kv))  # the reorder's ping-pong pair
    cache.self_kv = buffers[0]

    beams = Beams(n, k, max_len, prefix_len, length_penalty, rule, eos, forced_eos, scores, device)
    h_buf = h.repeat_interleave(k, dim=0)  # (n*k, d) the states the next choice reads
    pos = torch.full((1,), cache.length, dtype=torch.long, device=device)  # next decoder position

    def body(src: torch.Tensor, dst: torch.Tensor, first: bool = False) -> None:
        tokens, rows = beams.choose(h_buf, first=first)
        torch.index_select(src, 2, rows, out=dst)
        cache.self_kv = dst
        h_buf.copy_(dec.step_fixed(tokens, cache, pos))
        pos.add_(1)

    steps = [lambda: body(*buffers), lambda: body(*buffers[::-1])]  # even steps A -> B, odd B -> A
    if capture and last > 0:
        tensors = (h_buf, pos, buffers[0], *beams.tensors())
        saved = [t.clone() for t in tensors]
        steps = [capture_graph(fn) for fn in steps]
        # The warm-ups ran real steps: put every buffer back (capture itself runs nothing).
        for t, s in zip(tensors, saved, strict=True):
            t.copy_(s)
        overflow.zero_()

    sync_every = search._sync_every(device, None)
    for step in range(last):
        if step == 0 and k > 1:
            body(*buffers, first=True)  # eagerly: n rows scored, not n*k
        else:
            steps[step % 2]()
        cache.self_kv = buffers[(step + 1) % 2]
        cache.length += 1
        if (step + 1) % sync_every == 0 and bool(beams.done.all() | overflow):  # the host read
            break
    else:
        beams.choose(h_buf, final=True, first=last == 0 and k > 1)
    if bool(overflow):
        log.info(
            "graphed beam: a union outgrew capacity %d; batch decoded again eagerly", projection.capacity
        )
        return search.beam_search(
            adapter, projection.project, batch, src_lang, tgt_lang, beam=beam, max_len=max_len,
            length_penalty=length_penalty, early_stopping=rule,
        )  # fmt: skip
    return [search._strip(row, eos) for row in beams.fin_seqs[:, 0].tolist()]

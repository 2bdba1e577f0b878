"""Greedy search with the whole decoding step in one CUDA graph (issue 16, item 3).

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

Without CUDA (or with ``capture=False``) the same step runs eagerly: that is how the CPU tests check that
the outputs equal :func:`~fastvocab.decoding.search.greedy_search`'s, hence ``generate``'s. Not yet the
default on CUDA: ``tests/gpu/test_engine_graph.py`` and the GPU campaign check it first.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from fastvocab.decoding import search
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


def capture(fn: Callable[[], object], warmups: int = 1) -> Callable[[], None]:
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
        replay = capture(body)
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

"""Greedy and beam search with the whole decoding step in CUDA graphs (issue 16, item 3).

Eager decoding on a GPU launches a few hundred small kernels per step from Python, and at small batch that,
not the arithmetic, is the step's cost. Here one step (the token choice, the search's bookkeeping and the
static engine's fixed-shape decoder step, :meth:`~fastvocab.decoding.engine.StaticDecoder.step_fixed`) is
captured once per batch and replayed, with nothing read back to the host except the stop check every
``SYNC_EVERY`` steps (``fastvocab.decoding.search``'s schedule). Rows that finish stay in the batch (no
compaction: a new row count would need a new graph), and keep emitting EOS.

The token choice must not read the host either, so only projections with a capturable step run here
(:func:`graph_output`): the full projection and the static-capacity union
(``kernels.clustered_static.StaticUnion``; today's union mode reads its column count back every step). A
union that outgrows the static capacity sets a device flag; read at the next host read, it sends the batch
to the eager search, where such a step gets the full logits: a column is never dropped silently.

Beam search (:func:`beam_search_graphed`) keeps every sentence in the batch too. It runs the eager
search's own step (``search.row_candidates`` and ``search.BeamState``, whose tensors keep their shapes and
addresses; a done sentence's finished hypotheses stay frozen), and its cache reorder gathers the whole
self-attention capacity from one buffer into the other. So it captures two graphs, A -> B and B -> A,
and replays them in turn; the first step (one row per sentence, as the eager search scores it) and the last
(every candidate finishes) run eagerly.

Without CUDA (or with ``capture=False``) the same steps run eagerly: that is how the CPU tests check that
the outputs equal :func:`~fastvocab.decoding.search.greedy_search`'s and
:func:`~fastvocab.decoding.search.beam_search`'s, hence ``generate``'s. :func:`decode` is the entry point
(``tasks.translate(graphs=True)``; union-mode clustered runs as a static-capacity union, :func:`capturable`).
Not yet the default on CUDA nor a CLI option: ``tests/gpu/test_engine_graph.py`` and the GPU campaign (its
``e2e`` and ``e2e-demo`` steps) check and time them first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from fastvocab.decoding import search
from fastvocab.kernels.base import Projection, ProjectionOutput
from fastvocab.kernels.clustered import ClusteredProjection
from fastvocab.kernels.clustered_static import StaticUnion
from fastvocab.kernels.full import FullProjection

log = logging.getLogger(__name__)

Pick = Callable[[torch.Tensor], torch.Tensor]  # h (rows, d) -> greedy token ids (rows,), no host read


def graph_output(
    projection: object, overflow: torch.Tensor | None = None
) -> Callable[[torch.Tensor], ProjectionOutput] | None:
    """``projection``'s step as a capturable function ``h (rows, d) -> ProjectionOutput`` (nothing read back
    to the host), or None when it has none: the full projection, or a static-capacity union
    (``kernels.clustered_static.StaticUnion``; today's union mode reads its column count back every step).

    ``overflow``: a 0-d bool device tensor that the static union ORs with "this step's union did not fit"
    (its output is then not to be trusted; the caller reads the flag at its next host read).
    """
    if isinstance(projection, FullProjection):
        return projection
    if isinstance(projection, StaticUnion):

        def union_output(h: torch.Tensor) -> ProjectionOutput:
            # padded columns: -inf logits, ids repeating a real one
            return projection.step(h, overflow).output(projection.n_vocab)

        return union_output
    return None


def graph_pick(
    projection: object, banned: torch.Tensor | None = None, overflow: torch.Tensor | None = None
) -> Pick | None:
    """The greedy choice of ``projection`` as a capturable function (:func:`graph_output`), or None when it
    has none. ``banned``: vocabulary ids never chosen (the search's suppressed ids)."""
    output = graph_output(projection, overflow)
    return None if output is None else _pick(output, banned)


def _pick(output: Callable[[torch.Tensor], ProjectionOutput], banned: torch.Tensor | None) -> Pick:
    def pick(h: torch.Tensor) -> torch.Tensor:
        out = output(h)
        logits = search._suppress(out, out.logits, banned)
        return out.to_vocab_ids(logits.argmax(dim=1, keepdim=True))[:, 0]

    return pick


def _graph_parts(adapter, projection: object, what: str):
    """The static decoder, a 0-d overflow flag on the device and ``projection``'s capturable output
    (:func:`graph_output`) for a graphed ``what`` search; a ValueError naming what is missing."""
    dec = adapter.static_decoder
    if dec is None:
        raise ValueError(f"graphed {what} search needs the static engine (engine='static')")
    overflow = torch.zeros((), dtype=torch.bool, device=adapter.device)
    output = graph_output(projection, overflow)
    if output is None:
        raise ValueError(
            f"{type(projection).__name__} has no capturable output: use the full projection or a "
            "static-capacity union (kernels.clustered_static.StaticUnion)"
        )
    return dec, overflow, output


def capturable(projection: object, rows: int) -> object:
    """``projection`` as the graphed searches take it: one with a capturable step (:func:`graph_output`) as
    it is; union-mode clustered as a static-capacity union that no ``rows`` rows can outgrow
    (``StaticUnion(projection, rows=rows)``, the same outputs); anything else a ValueError."""
    if graph_output(projection) is not None:
        return projection
    if isinstance(projection, ClusteredProjection) and projection.selection == "union":
        return StaticUnion(projection, rows=rows)
    raise ValueError(
        f"{type(projection).__name__} has no capturable output: CUDA graphs run the full projection or "
        "union-mode clustered"
    )


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
    dec, overflow, output = _graph_parts(adapter, projection, "greedy")
    pick = _pick(output, search._banned_ids(adapter, adapter.device))
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
        assert isinstance(projection, StaticUnion)  # only a static union can overflow
        # A union outgrew the static capacity: never serve a choice made without all its columns. The batch
        # is decoded again eagerly, where an overflowing step gets the full logits (StaticUnion.project).
        log.info(
            "graphed greedy: a union outgrew capacity %d; batch decoded again eagerly", projection.capacity
        )
        return search.greedy_search(adapter, projection.project, batch, src_lang, tgt_lang, max_len=max_len)
    return [search._strip(row, eos) for row in out_tokens.tolist()]


# ----------------------------------------------------------------------------------------------- beam search


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
    dec, overflow, output = _graph_parts(adapter, projection, "beam")
    device = adapter.device
    n = batch["input_ids"].shape[0]
    if n == 0:
        return []
    capture = device.type == "cuda" if capture is None else capture
    eos, forced_eos = adapter.eos_id, getattr(adapter, "forced_eos_id", None)
    banned = search._banned_ids(adapter, device)
    k = beam

    h, state, prefix_len = search._start(adapter, batch, tgt_lang, max_len)
    state = adapter.reorder(state, torch.arange(n, device=device).repeat_interleave(k), group=k)
    cache = state.cache
    last = max_len - 1  # the step whose tokens are never fed back (run eagerly below)
    if last > 0:
        dec.prepare_fixed(cache, cache.length + last - 1)
    buffers = (cache.self_kv.contiguous(), torch.empty_like(cache.self_kv))  # the reorder's ping-pong pair
    cache.self_kv = buffers[0]

    beams = search.BeamState(n, k, max_len, prefix_len, length_penalty, rule, eos, device)
    h_buf = h.repeat_interleave(k, dim=0)  # (n*k, d) the states the next choice reads
    pos = torch.full((1,), cache.length, dtype=torch.long, device=device)  # next decoder position

    def choose(final: bool = False, first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The search's step on ``h_buf``: tokens (n, k) and the row each continues (no host read)."""
        if final and forced_eos is not None:
            return beams.advance(*search.forced_candidates(n * k, forced_eos, device), final=True)
        out = output(h_buf[::k].contiguous() if first else h_buf)
        return beams.advance(*search.row_candidates(out, banned, k, first), final=final)

    def body(src: torch.Tensor, dst: torch.Tensor, first: bool = False) -> None:
        tokens, rows = choose(first=first)
        torch.index_select(src, 2, rows.reshape(-1), out=dst)
        cache.self_kv = dst
        h_buf.copy_(dec.step_fixed(tokens.reshape(-1), cache, pos))
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
        choose(final=True, first=last == 0 and k > 1)
    if bool(overflow):
        assert isinstance(projection, StaticUnion)  # only a static union can overflow
        log.info(
            "graphed beam: a union outgrew capacity %d; batch decoded again eagerly", projection.capacity
        )
        return search.beam_search(
            adapter, projection.project, batch, src_lang, tgt_lang, beam=beam, max_len=max_len,
            length_penalty=length_penalty, early_stopping=rule,
        )  # fmt: skip
    return [search._strip(row, eos) for row in beams.fin_seqs[:, 0].tolist()]


def decode(
    adapter,
    projection: Projection,
    batch: dict,
    src_lang: str,
    tgt_lang: str,
    *,
    beam: int = 1,
    max_len: int = 128,
    length_penalty: float = 1.0,
    early_stopping: bool | str | None = None,
) -> list[list[int]]:
    """:func:`fastvocab.decoding.search.decode` with the step in CUDA graphs (on CUDA; the same outputs):
    the full projection as it is, union-mode clustered as a static-capacity union (:func:`capturable`)."""
    step = capturable(projection, rows=batch["input_ids"].shape[0] * beam)
    if beam == 1:
        return greedy_search_graphed(adapter, step, batch, src_lang, tgt_lang, max_len=max_len)
    return beam_search_graphed(
        adapter,
        step,
        batch,
        src_lang,
        tgt_lang,
        beam=beam,
        max_len=max_len,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )

"""A lean static-shape decoder step for the supported seq2seq families (``model_families``).

Why not the Hugging Face decoder: called eagerly once per target token, ``M2M100Decoder.forward`` builds
masks, position ids and a ``DynamicCache`` that grows by ``torch.cat`` every step (a copy of the whole cache
per layer per step), with Python-side bookkeeping around every layer. :class:`StaticDecoder` takes the
weights of the loaded Hugging Face model into a few small modules whose step is only the arithmetic:

- self-attention: one fused QKV GEMM (3d x d), the 1/sqrt(head_dim) scaling folded into the Q rows;
- a self-attention KV cache preallocated as (2, layers, rows, heads, capacity, head_dim) and written in place
  at the current position; the search sizes it once (forced prefix + ``max_len`` - 1 positions), and a
  caller that feeds more tokens than the capacity gets it doubled, not an error;
- cross-attention keys/values of every layer from one GEMM over the encoder output, once per batch, stored per
  *source sentence*: beam search's k rows of a sentence attend to the same block as one (k, S) matmul, and
  reordering beams never copies them (only dropping finished sentences does);
- row selection (finished rows, beam reordering) by ``index_select`` of the filled part of the cache only,
  into a second buffer that then swaps with the first (a fresh allocation every beam step cost more than
  the copy on CPU: page faults);
- every cache allocation checked first (``cache_memory``);
- on CPU in float32, the layers' linears of at least 4 MiB multiply a pre-packed copy of their weight at the
  row counts where that measured faster (``kernels.prepack``: up to 4x at M2M100-418M's sizes; one more copy
  of those weights).

``h`` is what ``lm_head`` multiplies: the output projection is not applied here.
:meth:`StaticDecoder.step_fixed` is the step with every shape fixed (the position on the device, attention
over the whole capacity with later positions masked), which a CUDA graph can capture
(``decoding.steppers.CapturedStepper``). Measurements, and what was tried and left out (``torch.compile``,
pre-packed weights at the demo model's sizes, ``scaled_dot_product_attention``):
benchmarks/history/engine-notes.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fastvocab.decoding.cache_memory import allocate_cache, cache_limit
from fastvocab.decoding.inference import step_inference
from fastvocab.decoding.model_families import (
    Family,
    HFModule,
    activation,
    cat_bias,
    embed_scale,
    fused_linear,
    fused_qkv,
    unsupported_reason,
)
from fastvocab.kernels.prepack import prepack_linears

log = logging.getLogger(__name__)


@dataclass
class StaticState:
    """Decoder state of the static engine for ``rows`` live rows.

    ``self_kv`` (2, layers, rows, heads, capacity, head_dim): self-attention keys [0] and values [1], filled
    up to ``length``. ``cross_kv`` (2, layers, sources, heads, S, head_dim): cross-attention keys/values per
    source sentence; row ``r`` reads source ``r // group``. ``cross_bias`` (sources, 1, 1, S): 0 on real
    source tokens, the dtype's minimum on padding.

    ``self_kv`` is the first ``rows`` rows of ``buffer``; ``spare`` is a second buffer of the same layout
    that :meth:`StaticDecoder.reorder` gathers into (the two then swap), so beam search's per-step reorder
    allocates nothing.
    """

    self_kv: torch.Tensor
    cross_kv: torch.Tensor
    cross_bias: torch.Tensor
    group: int  # consecutive rows sharing one source sentence (beam size after expansion, else 1)
    length: int  # target tokens consumed so far (positions 0..length-1 of self_kv are filled)
    buffer: torch.Tensor | None = None  # what self_kv views (given as None: self_kv itself)
    spare: torch.Tensor | None = None  # (2, layers, >= rows, heads, capacity, head_dim) or None

    def __post_init__(self) -> None:
        if self.buffer is None:
            self.buffer = self.self_kv

    @property
    def rows(self) -> int:
        return self.self_kv.shape[2]

    @property
    def capacity(self) -> int:
        return self.self_kv.shape[4]

    def cache_bytes(self) -> int:
        """Bytes held by the self- and cross-attention caches (both self-attention buffers)."""
        held = [self.buffer, self.cross_kv, self.cross_bias, self.spare]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


@dataclass
class _Fixed:
    """What :meth:`StaticDecoder.step_fixed` hands its layers: the position and the mask, on the device."""

    pos: torch.Tensor  # (1,) int64: where this step's keys/values go
    mask: torch.Tensor  # (capacity,) 0 up to pos, the dtype's minimum after it


class _Layer(nn.Module):
    """One decoder layer with a fused QKV projection (weights taken from the HF layer); pre-norm (M2M100,
    MBart) or post-norm (Marian)."""

    def __init__(self, hf_layer: HFModule, heads: int, act: nn.Module, pre_norm: bool) -> None:
        super().__init__()
        sa, ca = hf_layer.self_attn, hf_layer.encoder_attn
        d = sa.q_proj.in_features
        self.heads, self.head_dim = heads, d // heads
        self.pre_norm = pre_norm
        scaling = self.head_dim**-0.5
        self.qkv = fused_qkv(sa, scaling)
        with torch.no_grad():
            self.q_cross = fused_linear(ca.q_proj.weight * scaling, cat_bias([(ca.q_proj, scaling)]))
        self.out_self = sa.out_proj
        self.out_cross = ca.out_proj
        self.ln_self = hf_layer.self_attn_layer_norm
        self.ln_cross = hf_layer.encoder_attn_layer_norm
        self.ln_ffn = hf_layer.final_layer_norm
        self.fc1, self.fc2, self.act = hf_layer.fc1, hf_layer.fc2, act

    def forward(
        self, x: torch.Tensor, state: StaticState, i: int, fixed: _Fixed | None = None
    ) -> torch.Tensor:
        """x (rows, d) -> (rows, d); writes this layer's key/value at position ``state.length`` (or at
        ``fixed``'s device-side position, :meth:`StaticDecoder.step_fixed`)."""
        if self.pre_norm:  # x + f(ln(x))
            x = x + self._self_attn(self.ln_self(x), state, i, fixed)
            x = x + self._cross_attn(self.ln_cross(x), state, i)
            return x + self.fc2(self.act(self.fc1(self.ln_ffn(x))))
        # post-norm (Marian): ln(x + f(x))
        x = self.ln_self(x + self._self_attn(x, state, i, fixed))
        x = self.ln_cross(x + self._cross_attn(x, state, i))
        return self.ln_ffn(x + self.fc2(self.act(self.fc1(x))))

    def _self_attn(self, x: torch.Tensor, state: StaticState, i: int, fixed: _Fixed | None) -> torch.Tensor:
        rows, d = x.shape
        h, hd, pos = self.heads, self.head_dim, state.length
        k_cache, v_cache = state.self_kv[0, i], state.self_kv[1, i]  # (rows, heads, capacity, hd)
        qkv = self.qkv(x).view(rows, 3, h, hd)  # (rows, 3, heads, hd)
        if fixed is not None:  # the whole capacity, later positions masked: no shape depends on the position
            k_cache.index_copy_(2, fixed.pos, qkv[:, 1].unsqueeze(2))
            v_cache.index_copy_(2, fixed.pos, qkv[:, 2].unsqueeze(2))
            keys, values = k_cache, v_cache
        else:
            k_cache[:, :, pos].copy_(qkv[:, 1])
            v_cache[:, :, pos].copy_(qkv[:, 2])
            keys, values = k_cache[:, :, : pos + 1], v_cache[:, :, : pos + 1]  # (rows, heads, n, hd) views
        q = qkv[:, 0].unsqueeze(2)  # (rows, heads, 1, hd)
        scores = q @ keys.transpose(2, 3)  # (rows, heads, 1, n)
        if fixed is not None:
            scores = scores + fixed.mask
        return self.out_self((torch.softmax(scores, dim=-1) @ values).view(rows, d))

    def _cross_attn(self, x: torch.Tensor, state: StaticState, i: int) -> torch.Tensor:
        # Rows grouped by source: (sources, heads, group, hd) queries per (S, hd) block.
        rows, d = x.shape
        h, hd, g = self.heads, self.head_dim, state.group
        q = self.q_cross(x).view(rows // g, g, h, hd).transpose(1, 2)
        ck, cv = state.cross_kv[0, i], state.cross_kv[1, i]  # (sources, heads, S, hd)
        att = torch.softmax(q @ ck.transpose(2, 3) + state.cross_bias, dim=-1)  # (sources, heads, g, S)
        o = (att @ cv).transpose(1, 2).reshape(rows, d)  # (sources, g, heads, hd) -> (rows, d)
        return self.out_cross(o)


class StaticDecoder(nn.Module):
    """The decoder of a supported model (M2M100/NLLB, Marian, MBart) as a cached one-token step (see the
    module docstring).

    Built from a loaded Hugging Face ``...ForConditionalGeneration``; shares its layer norms, output and
    feed-forward linears, embedding matrix and position table (no copy), and owns only the fused QKV /
    cross-KV weights. ``max_cache_bytes``: refuse any one cache allocation above this (default: the
    ``FASTVOCAB_CACHE_LIMIT_MB`` environment variable, else only the device's free memory limits it).
    """

    def __init__(self, model: HFModule, capacity: int = 64, max_cache_bytes: int | None = None) -> None:
        super().__init__()
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(reason)

        config = model.config
        dec = model.get_decoder()
        self.family = Family.of(model)
        self.d = config.d_model
        self.heads = config.decoder_attention_heads
        self.head_dim = self.d // self.heads
        self.n_layers = len(dec.layers)
        self.pad_id = int(config.pad_token_id)
        self.embed_weight = dec.embed_tokens.weight.detach()  # (N, d), shared with the HF model
        self.embed_scale = embed_scale(dec)
        self.pos_offset = self.family.pos_offset  # table row of target position t is t + pos_offset
        self.capacity = int(capacity)
        self.max_cache_bytes = cache_limit(max_cache_bytes)
        if self.family.extendable:
            self._get_embedding = dec.embed_positions.get_embedding
            self.positions = self._position_table(config.max_position_embeddings + self.pos_offset)
        else:
            self.positions = dec.embed_positions.weight.detach()  # (max positions (+ offset), d), shared
        self.ln_embed = getattr(dec, "layernorm_embedding", None)  # MBart
        self.final_ln = getattr(dec, "layer_norm", None)  # M2M100, MBart; Marian has none
        act = activation(config.activation_function)
        pre = self.family.pre_norm
        self.layers = nn.ModuleList(_Layer(layer, self.heads, act, pre) for layer in dec.layers)
        with torch.no_grad():
            # Cross-attention K and V of every layer in one (layers * 2 * d, d) GEMM over the encoder output.
            kv = [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj) for layer in dec.layers]
            self.cross_kv = fused_linear(
                torch.cat([p.weight for pair in kv for p in pair]),
                cat_bias([(p, 1.0) for pair in kv for p in pair]),
            )
        # The per-step linears on pre-packed weights where they are large enough to pay (kernels/prepack.py);
        # not the cross K/V GEMM, which runs once per batch over every source token, where packing gains
        # nothing.
        prepack_linears(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    def _position_table(self, n: int) -> torch.Tensor:
        # Hugging Face's own builder: row i is identical whatever n is, and row padding_idx is zero.
        table = self._get_embedding(n, self.d, self.pad_id)
        return table.to(device=self.embed_weight.device, dtype=self.embed_weight.dtype)  # (n, d)

    def cache_bytes_per_row(self, positions: int) -> int:
        """Self-attention cache bytes per decoder row (batch x beam rows) for ``positions`` positions."""
        return 2 * self.n_layers * self.d * positions * self.embed_weight.element_size()

    # ------------------------------------------------------------------ state

    def _alloc(self, shape: tuple[int, ...], what: str) -> torch.Tensor:
        return allocate_cache(shape, self.dtype, self.device, self.max_cache_bytes, what)

    @torch.inference_mode()
    def start(self, enc_hidden: torch.Tensor, enc_mask: torch.Tensor, capacity: int | None = None):
        """State for a new batch: cross K/V from ``enc_hidden`` (rows, S, d), ``enc_mask`` (rows, S)."""
        n, s, _ = enc_hidden.shape
        cap = int(capacity or self.capacity)
        # Both caches are checked before the cross K/V GEMM runs: a batch that cannot fit fails at once.
        self_kv = self._alloc((2, self.n_layers, n, self.heads, cap, self.head_dim), "self-attention cache")
        cross = self._alloc((2, self.n_layers, n, self.heads, s, self.head_dim), "cross-attention cache")
        mask = enc_mask.to(self.device)
        where = mask.reshape(-1).nonzero()[:, 0]  # (T,) real source tokens
        flat = enc_hidden.to(self.dtype).reshape(n * s, self.d)
        if where.shape[0] == n * s:
            kv = self.cross_kv(flat)  # (n * S, layers * 2 * d)
        else:  # only the real tokens: padding keeps zero keys/values, masked by cross_bias anyway
            kv = flat.new_zeros((n * s, self.cross_kv.out_features))
            kv.index_copy_(0, where, self.cross_kv(flat.index_select(0, where)))
        kv = kv.view(n, s, self.n_layers, 2, self.heads, self.head_dim)
        cross.copy_(kv.permute(3, 2, 0, 4, 1, 5))  # (2, layers, n, heads, S, hd)
        bias = torch.zeros((n, 1, 1, s), dtype=self.dtype, device=self.device)
        bias.masked_fill_(mask[:, None, None, :] == 0, torch.finfo(self.dtype).min)
        return StaticState(self_kv, cross, bias, group=1, length=0)

    def _grow(self, state: StaticState) -> None:
        """Double the self-attention capacity (copying the filled part); the positions table follows."""
        new_cap = 2 * state.capacity
        log.debug("static decoder cache: capacity %d -> %d", state.capacity, new_cap)
        bigger = self._alloc((*state.self_kv.shape[:4], new_cap, self.head_dim), "self-attention cache")
        bigger[..., : state.length, :].copy_(state.self_kv[..., : state.length, :])
        state.self_kv, state.buffer, state.spare = bigger, bigger, None

    def reorder(self, state: StaticState, index: torch.Tensor, group: int | None = None) -> StaticState:
        """Rows ``index`` (rows',) of ``state`` in that order. Returns a new state; ``state`` must not be used
        again (its self-attention buffer becomes the new state's spare, overwritten by the next reorder).

        ``group``: the caller guarantees that rows ``[i*group, (i+1)*group)`` of the result share one
        source sentence and that sources appear in increasing order, none twice (beam search's layout):
        cross K/V then stay per source, and are not copied at all when the same sources remain. Without it,
        every row gets its own copy of its source's cross K/V (``group`` becomes 1).
        """
        index = index.to(self.device)
        n, rows = state.length, index.shape[0]
        # Into the spare buffer when it is big enough: a fresh allocation of this size costs more than the
        # copy itself on CPU (page faults on first touch; beam 4 x batch 32 on the demo model: 68 MB a step).
        spare = state.spare
        if spare is None or spare.shape[2] < rows or spare.shape[4] != state.capacity:
            spare = self._alloc(
                (*state.self_kv.shape[:2], rows, *state.self_kv.shape[3:]), "self-attention cache"
            )
        self_kv = spare[:, :, :rows]
        # Only the filled positions: copying the whole capacity would cost as much as a long sentence does.
        torch.index_select(state.self_kv[..., :n, :], 2, index, out=self_kv[..., :n, :])
        buffers = {"buffer": spare, "spare": state.buffer}
        g_old = state.group
        if group is not None and index.shape[0] % group == 0:
            sources = index[::group] // g_old  # (sources',)
            # Increasing and none twice (the contract): as many sources as before means the same ones, so no
            # comparison (on an accelerator a read back to the host) is needed.
            same = sources.shape[0] == state.cross_kv.shape[2]
            cross, bias = state.cross_kv, state.cross_bias
            if not same:
                cross, bias = cross.index_select(2, sources), bias.index_select(0, sources)
            return StaticState(self_kv, cross, bias, group, n, **buffers)
        sources = index // g_old if g_old > 1 else index  # (rows',)
        cross = state.cross_kv.index_select(2, sources)
        return StaticState(self_kv, cross, state.cross_bias.index_select(0, sources), 1, n, **buffers)

    # ------------------------------------------------------------------ step

    def _ensure_positions(self, pos: int) -> None:
        row = pos + self.pos_offset
        if row < self.positions.shape[0]:
            return
        if self.family.extendable:  # HF extends its sinusoidal table the same way
            self.positions = self._position_table(2 * (row + 1))
            return
        raise ValueError(
            f"target position {pos} is beyond the {self.family.name} model's position table "
            f"({self.positions.shape[0] - self.pos_offset} positions: max_position_embeddings); "
            "lower --max-len"
        )

    def embed(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """The first layer's input (rows, d) for one token per row at target position ``pos``."""
        self._ensure_positions(pos)
        if self.device.type == "cpu" and self.embed_weight.dtype == torch.float32 and self.ln_embed is None:
            return self._embed_host(tokens, pos)
        tokens = tokens.to(self.device)
        x = nn.functional.embedding(tokens, self.embed_weight) * self.embed_scale  # (rows, d)
        if self.family.pad_positions:
            # create_position_ids_from_input_ids: a pad token sits at padding_idx (zero row), others count on.
            pos_ids = torch.where(tokens == self.pad_id, self.pad_id, pos + self.pos_offset)  # (rows,)
            x = x + self.positions.index_select(0, pos_ids)
        else:
            x = x + self.positions[pos + self.pos_offset]  # (d,): every row is at the same position
        return x if self.ln_embed is None else self.ln_embed(x)

    def _embed_host(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """:meth:`embed` in numpy, on CPU: the same rows, float32 product and sum, in ~5 numpy operations
        at ~1 us each where the tensor code made seven torch ops at ~5 us each (a beam step's few rows)."""
        ids = tokens.numpy()
        x = self.embed_weight.numpy()[ids] * np.float32(self.embed_scale)  # (rows, d)
        row = pos + self.pos_offset
        if self.family.pad_positions:
            x += self.positions.numpy()[np.where(ids == self.pad_id, self.pad_id, row)]
        else:
            x += self.positions.numpy()[row]
        return torch.from_numpy(x)

    @step_inference
    def step(self, tokens: torch.Tensor, state: StaticState) -> torch.Tensor:
        """Feed one token per row (rows,); returns ``h`` (rows, d) and advances ``state`` in place."""
        pos = state.length
        if pos >= state.capacity:
            self._grow(state)
        x = self.embed(tokens, pos)
        for i, layer in enumerate(self.layers):
            x = layer(x, state, i)
        state.length = pos + 1
        return x if self.final_ln is None else self.final_ln(x)

    # ------------------------------------------------------------------ fixed-shape step (CUDA graphs)

    @torch.inference_mode()
    def prepare_fixed(self, state: StaticState, last_position: int) -> None:
        """Make ``state`` ready for :meth:`step_fixed` up to target position ``last_position``: capacity and
        position table that cover it, and the unfilled positions zeroed (``step_fixed`` reads the whole
        capacity; masked positions get weight 0, but uninitialised memory may hold NaN, and 0 x NaN is NaN).
        """
        while state.capacity <= last_position:
            self._grow(state)
        self._ensure_positions(last_position)
        state.self_kv[..., state.length :, :].zero_()

    @torch.inference_mode()
    def step_fixed(self, tokens: torch.Tensor, state: StaticState, pos: torch.Tensor) -> torch.Tensor:
        """:meth:`step` with every shape fixed by the state (rows, capacity) and the position on the device.

        ``pos`` (1,) int64 is this token's position: its keys/values are written there and attention reads
        the whole capacity with the later positions masked. No host value enters, so a CUDA graph captured
        around it replays at every position (the caller advances ``pos`` and ``state.length``, after
        :meth:`prepare_fixed`). Same ``h`` as :meth:`step` up to float rounding (tested); on CPU
        :meth:`step` is the faster one, as it reads only the filled positions.
        """
        tokens = tokens.to(self.device)
        x = nn.functional.embedding(tokens, self.embed_weight) * self.embed_scale  # (rows, d)
        row = pos + self.pos_offset  # (1,)
        if self.family.pad_positions:
            x = x + self.positions.index_select(0, torch.where(tokens == self.pad_id, self.pad_id, row))
        else:
            x = x + self.positions.index_select(0, row)  # (1, d)
        if self.ln_embed is not None:
            x = self.ln_embed(x)
        later = torch.arange(state.capacity, device=self.device) > pos  # (capacity,)
        mask = torch.zeros(state.capacity, dtype=self.dtype, device=self.device)
        fixed = _Fixed(pos, mask.masked_fill(later, torch.finfo(self.dtype).min))
        for i, layer in enumerate(self.layers):
            x = layer(x, state, i, fixed)
        return x if self.final_ln is None else self.final_ln(x)

"""A lean static-shape decoder step for the supported seq2seq families: M2M100 (NLLB, the demo model),
Marian and MBart.

Why not the Hugging Face decoder: called eagerly once per target token, ``M2M100Decoder.forward`` builds
masks, position ids and a ``DynamicCache`` that grows by ``torch.cat`` every step (a copy of the whole cache
per layer per step), with Python-side bookkeeping around every layer; on the demo model it was ~73% of the
clustered search time (issue 16). This module takes the weights of the loaded Hugging Face model (as
CTranslate2's converters do) into a few small modules whose step is only the arithmetic:

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
- a cache that would not fit (an explicit limit, ``max_cache_bytes`` or ``FASTVOCAB_CACHE_LIMIT_MB``, else
  the device's free memory for large allocations) is refused with a ``MemoryError`` naming its shape, bytes
  and the flags to lower, before anything is allocated.

The families differ only around the layers (:class:`_Family`, read from the Hugging Face decoder):

==========  ===================================================  ==============  ==========  ===========
family      positions                                            embedding norm  layers      final norm
==========  ===================================================  ==============  ==========  ===========
M2M100      sinusoidal, offset ``padding_idx + 1``; a pad token   no              pre-norm    yes
            gets the zero row ``padding_idx`` (HF's own builder)
Marian      sinusoidal table ``embed_positions.weight``, offset 0  no              post-norm   no
MBart       learned ``embed_positions.weight``, offset 2          yes             pre-norm    yes
==========  ===================================================  ==============  ==========  ===========

Embeddings are scaled by the family's ``embed_scale`` (``scale_embedding``); Marian's and MBart's
``final_logits_bias`` is the output bias, which the adapter hands to the projection (not applied here):
``h`` is what ``lm_head`` multiplies.

Measured (demo model: d=256, 2 decoder layers; AMD EPYC, 1 thread, 2 cores shared with other jobs, median of
5 interleaved rounds, 24 steps after the prefix): a step at 1 row 1.12 ms vs 2.71 ms for the Hugging Face
step (2.4x), at 32 rows 6.0 vs 7.7 ms, at 128 rows 16.0 vs 17.0 ms. From 32 rows on the step is GEMM time
(the linears run at ~55 GFLOP/s, near this CPU's fp32 peak on one core), so the engine's gain there is the
overhead it removes, and int8 weights (``fastvocab.decoding.int8``) are the next lever.
``scaled_dot_product_attention`` instead of plain matmuls for the one-query attention: 1.20 / 6.27 / 15.98 ms
at 1 / 32 / 128 rows, no better, so the step uses matmuls.

Pre-packed oneDNN weights (``torch.ops.mkldnn._reorder_linear_weight``, which make the full output projection
1.5-2x faster, ``fastvocab.kernels.full``) do not pay for these layers' small matrices: per call, packed /
plain time at 1 / 32 / 128 rows (1 thread) was 1.9 / 0.98 / 1.0 (QKV, 768 x 256), 1.6 / 0.97 / 0.89 (fc1),
1.9 / 0.90 / 1.1 (fc2), 4.0 / 1.4 / 1.15 (out, 256 x 256), and 1.05 for the cross K/V GEMM over 2,048 encoder
positions; a whole step with every linear packed took 11.7 / 28.9 / 59.2 ms against 9.2 / 30.3 / 60.9 ms
(measured under heavy load from other jobs: a loss at 1 row, noise at 32-128). So the linears stay
``nn.Linear``.

The encoder (:class:`PackedEncoder`, used with this engine): the Hugging Face encoder runs every layer on
the padded (rows, S) grid; sorting lines by length leaves much padding where lengths spread (issue 16's 200
en-it test lines, batch 32: 10,944 grid positions for 5,552 tokens, one 214-token line sets the first
batch's width). The packed encoder runs its linears, norms and FFN on the real tokens only and attention per
sentence (``scaled_dot_product_attention`` on a padded view), and the cross-attention K/V GEMM of
:meth:`StaticDecoder.start` skips padded positions too. Its states equal the HF encoder's bit for bit on the
demo model (1/sqrt(64) folded into Q is exact); the encoder of that run took 0.88 s instead of 1.80 s of
CPU time (1 thread, loaded machine).

Greedy search takes its argmax, beam search its per-row top-k, through ``fastvocab.decoding.rowwise``
(torch's CPU argmax over 32K columns was ~8% of a full-softmax greedy run, its top-k ~9% of a beam-4 run).

``torch.compile`` (inductor, CPU, ``freezing=True``) of this step was tried (issue 16, CPU part) and left
out: with ``dynamic=True`` the step still specialised on the cache position and recompiled every step until
the recompile limit; 3 steps took 371 s of compilation on this 2-core machine (g++ per kernel), the outputs
moved in the last bits (frozen linears are oneDNN GEMMs: 1.5e-6 on ``h``), and after falling back the step
was slower (19-28 ms against 8-9 ms at 32 rows under the same load). A step compiled once per shape would
need a fixed-capacity attention with a mask and the row count padded to buckets; in a 1-thread profile the
linears and the attention matmuls are ~70% of a 32-row step, so the dispatch overhead it removes is at most
the rest. On CUDA, where launch overhead dominates, a CUDA graph of the step is the way:
:meth:`StaticDecoder.step_fixed` is the step with every shape fixed (the position on the device, attention
over the whole capacity with later positions masked), equal to :meth:`step` on CPU (tests) and captured and
replayed in ``tests/gpu/test_engine_graph.py``. ``fastvocab.decoding.graphed`` runs greedy search with the
whole step (token choice included) in one graph, and beam search in two (its cache reorder gathers the whole
capacity from one buffer into the other, and back in the other graph); the GPU campaign's e2e step times
them against the eager searches.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

# A loaded Hugging Face model or one of its modules: read by attribute name (config, layers, projections),
# which ``nn.Module``'s typing cannot follow.
HFModule = Any


# Hugging Face model types the engine implements, by family.
FAMILIES = {"m2m_100": "m2m100", "marian": "marian", "mbart": "mbart"}

# Environment variable: cap on one static-cache allocation, in MiB (``StaticDecoder(max_cache_bytes=)``).
CACHE_LIMIT_ENV = "FASTVOCAB_CACHE_LIMIT_MB"
# Allocations at least this big are also checked against the device's free memory (a cheap read, but not one
# to make every step for the small reorders).
_CHECK_FREE_BYTES = 256 << 20


def unsupported_reason(model: HFModule) -> str | None:
    """None when :class:`StaticDecoder` can run ``model``; otherwise why not (for the error message)."""
    config = model.config
    model_type = getattr(config, "model_type", "")
    if model_type not in FAMILIES:
        return (
            f"the static engine implements M2M100 (NLLB, the demo model), Marian and MBart; "
            f"{model_type!r} models use engine='hf'"
        )
    decoder = model.get_decoder()
    if model_type == "m2m_100" and not hasattr(getattr(decoder, "embed_positions", None), "get_embedding"):
        return "the decoder has no sinusoidal position table (not an M2M100 decoder); use engine='hf'"
    if model_type != "m2m_100" and not isinstance(getattr(decoder, "embed_positions", None), nn.Embedding):
        return f"the {model_type} decoder has no position table (embed_positions); use engine='hf'"
    if config.d_model % config.decoder_attention_heads:
        return f"d_model {config.d_model} is not a multiple of {config.decoder_attention_heads} heads"
    return None


@dataclass(frozen=True)
class _Family:
    """What differs between the families around the layers (module docstring's table)."""

    name: str
    pre_norm: bool  # layer norm before each sublayer (M2M100, MBart) or after the residual add (Marian)
    pos_offset: int  # table row of target position 0
    pad_positions: bool  # a pad token takes the zero row padding_idx (M2M100's position ids)
    extendable: bool  # the position table can be rebuilt longer (sinusoidal, M2M100's builder)

    @staticmethod
    def of(model: HFModule) -> _Family:
        name = FAMILIES[model.config.model_type]
        if name == "m2m100":
            return _Family(name, True, int(model.config.pad_token_id) + 1, True, True)
        if name == "marian":
            return _Family(name, False, 0, False, False)
        offset = int(getattr(model.get_decoder().embed_positions, "offset", 2))
        return _Family(name, True, offset, False, False)


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
        with torch.no_grad():
            # Fused (3d, d): Q rows pre-scaled by 1/sqrt(head_dim), so attention needs no extra multiply.
            self.qkv = _linear(
                torch.cat([sa.q_proj.weight * scaling, sa.k_proj.weight, sa.v_proj.weight]),
                _cat_bias([(sa.q_proj, scaling), (sa.k_proj, 1.0), (sa.v_proj, 1.0)]),
            )
            self.q_cross = _linear(ca.q_proj.weight * scaling, _cat_bias([(ca.q_proj, scaling)]))
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


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device)
    lin = lin.to(weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin.requires_grad_(False)


def _cat_bias(parts: list[tuple[nn.Linear, float]]) -> torch.Tensor | None:
    if all(p.bias is None for p, _ in parts):
        return None
    return torch.cat(
        [
            p.bias * s if p.bias is not None else torch.zeros(p.out_features, dtype=p.weight.dtype)
            for p, s in parts
        ]
    )


def _embed_scale(decoder: HFModule) -> float:
    # M2M100/MBart scale inside their embedding module, Marian in the decoder's forward.
    scale = getattr(decoder.embed_tokens, "embed_scale", None)
    if scale is None:
        scale = getattr(decoder, "embed_scale", None)
    return float(scale or 1.0)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**17 else f"{n:,} bytes"


def _free_bytes(device: torch.device) -> int | None:
    """Memory that can still be allocated on ``device`` (CPU: MemAvailable), None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def encoder_unsupported_reason(model: HFModule) -> str | None:
    """None when :class:`PackedEncoder` can run ``model``'s encoder; otherwise why not."""
    reason = unsupported_reason(model)
    if reason:
        return reason
    config, enc = model.config, model.get_encoder()
    if config.d_model % config.encoder_attention_heads:
        return f"d_model {config.d_model} is not a multiple of {config.encoder_attention_heads} heads"
    pos = getattr(enc, "embed_positions", None)
    if config.model_type == "m2m_100" and not hasattr(pos, "get_embedding"):
        return "the encoder has no sinusoidal position table (not an M2M100 encoder)"
    if config.model_type != "m2m_100" and not isinstance(pos, nn.Embedding):
        return f"the {config.model_type} encoder has no position table (embed_positions)"
    return None


class _EncoderLayer(nn.Module):
    """One encoder layer over the *packed* real tokens (T, d): fused QKV (Q pre-scaled), attention per
    sentence on a padded (rows, heads, S, hd) view, everything else per token; weights shared with the HF
    layer except the fused QKV."""

    def __init__(self, hf_layer: HFModule, heads: int, act: nn.Module, pre_norm: bool) -> None:
        super().__init__()
        sa = hf_layer.self_attn
        d = sa.q_proj.in_features
        self.heads, self.head_dim, self.pre_norm = heads, d // heads, pre_norm
        scaling = self.head_dim**-0.5
        with torch.no_grad():
            self.qkv = _linear(
                torch.cat([sa.q_proj.weight * scaling, sa.k_proj.weight, sa.v_proj.weight]),
                _cat_bias([(sa.q_proj, scaling), (sa.k_proj, 1.0), (sa.v_proj, 1.0)]),
            )
        self.out = sa.out_proj
        self.ln_attn, self.ln_ffn = hf_layer.self_attn_layer_norm, hf_layer.final_layer_norm
        self.fc1, self.fc2, self.act = hf_layer.fc1, hf_layer.fc2, act

    def forward(self, x: torch.Tensor, where: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x (T, d) packed tokens; ``where`` (T,) their flat index in the (rows * S) grid; ``key_mask``
        (rows, 1, 1, S) True on real tokens."""
        if self.pre_norm:
            x = x + self._attn(self.ln_attn(x), where, key_mask)
            return x + self.fc2(self.act(self.fc1(self.ln_ffn(x))))
        x = self.ln_attn(x + self._attn(x, where, key_mask))  # post-norm (Marian)
        return self.ln_ffn(x + self.fc2(self.act(self.fc1(x))))

    def _attn(self, x: torch.Tensor, where: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        rows, s = key_mask.shape[0], key_mask.shape[-1]
        d = x.shape[1]
        h, hd = self.heads, self.head_dim
        grid = x.new_zeros((rows * s, 3 * d))  # padding stays 0: finite keys/values, masked anyway
        grid.index_copy_(0, where, self.qkv(x))  # (T, 3d) -> (rows * S, 3d)
        q, k, v = grid.view(rows, s, 3, h, hd).permute(2, 0, 3, 1, 4)  # each (rows, heads, S, hd)
        o = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, scale=1.0)
        o = o.transpose(1, 2).reshape(rows * s, d).index_select(0, where)  # (T, d)
        return self.out(o)


class PackedEncoder(nn.Module):
    """The encoder of a supported model without computing padding: the linears, layer norms and FFN run on
    the batch's real tokens only (T rows instead of rows x S), attention per sentence on a padded view.

    Sorting lines by length does not remove padding where lengths spread: on the demo run's 200 en-it test
    lines (batch 32, longest first) the padded grid held 10,944 positions for 5,552 tokens (one 214-token
    line sets the first batch's width). Positions, embedding scale, layer order and final norm follow the HF
    encoder of each family (the ``_Family`` table); outputs at padded positions are zero (the decoder's
    cross-attention masks them). Same values as the HF encoder up to fp32 rounding (another GEMM row count,
    scaling folded into Q).
    """

    def __init__(self, model: HFModule) -> None:
        super().__init__()
        reason = encoder_unsupported_reason(model)
        if reason:
            raise ValueError(reason)
        from transformers.activations import ACT2FN

        config, enc = model.config, model.get_encoder()
        self.family = _Family.of(model)
        self.d = config.d_model
        self.pad_id = int(config.pad_token_id)
        self.embed_weight = enc.embed_tokens.weight.detach()  # (N, d), shared
        self.embed_scale = _embed_scale(enc)
        if self.family.extendable:
            self._get_embedding = enc.embed_positions.get_embedding
            self.positions = self._position_table(config.max_position_embeddings + self.family.pos_offset)
        else:
            self.positions = enc.embed_positions.weight.detach()  # (positions (+ offset), d), shared
        self.ln_embed = getattr(enc, "layernorm_embedding", None)  # MBart
        self.final_ln = getattr(enc, "layer_norm", None)  # M2M100, MBart
        act = ACT2FN[config.activation_function]
        heads = config.encoder_attention_heads
        self.layers = nn.ModuleList(_EncoderLayer(x, heads, act, self.family.pre_norm) for x in enc.layers)

    def _position_table(self, n: int) -> torch.Tensor:
        table = self._get_embedding(n, self.d, self.pad_id)
        return table.to(device=self.embed_weight.device, dtype=self.embed_weight.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(rows, S) ids and mask (1 = real token) -> hidden states (rows, S, d), zero at padding."""
        rows, s = input_ids.shape
        fam = self.family
        if fam.pad_positions:  # create_position_ids_from_input_ids: real tokens count on from padding_idx + 1
            real = (input_ids != self.pad_id).long()
            pos_ids = torch.cumsum(real, dim=1) * real + self.pad_id  # (rows, S)
        else:
            pos_ids = torch.arange(s, device=input_ids.device).expand(rows, s) + fam.pos_offset
        need = int(pos_ids.max()) + 1 if s else 0
        if need > self.positions.shape[0]:
            if not fam.extendable:
                raise ValueError(
                    f"source of {s} tokens is beyond the {fam.name} model's position table "
                    f"({self.positions.shape[0] - fam.pos_offset} positions: max_position_embeddings)"
                )
            self.positions = self._position_table(2 * need)
        where = attention_mask.reshape(-1).nonzero()[:, 0]  # (T,) flat index of each real token
        ids, pos = input_ids.reshape(-1)[where], pos_ids.reshape(-1)[where]
        x = nn.functional.embedding(ids, self.embed_weight) * self.embed_scale  # (T, d)
        x = x + self.positions.index_select(0, pos)
        if self.ln_embed is not None:
            x = self.ln_embed(x)
        key_mask = (attention_mask != 0)[:, None, None, :]  # (rows, 1, 1, S)
        for layer in self.layers:
            x = layer(x, where, key_mask)
            if x.dtype == torch.float16:  # HF clamps fp16 overflow the same way after every layer
                big = torch.finfo(x.dtype).max - 1000
                x = x.clamp(-big, big)
        if self.final_ln is not None:
            x = self.final_ln(x)
        out = x.new_zeros((rows * s, self.d))
        out.index_copy_(0, where, x)
        return out.view(rows, s, self.d)


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
        from transformers.activations import ACT2FN

        config = model.config
        dec = model.get_decoder()
        self.family = _Family.of(model)
        self.d = config.d_model
        self.heads = config.decoder_attention_heads
        self.head_dim = self.d // self.heads
        self.n_layers = len(dec.layers)
        self.pad_id = int(config.pad_token_id)
        self.embed_weight = dec.embed_tokens.weight.detach()  # (N, d), shared with the HF model
        self.embed_scale = _embed_scale(dec)
        self.pos_offset = self.family.pos_offset  # table row of target position t is t + pos_offset
        self.capacity = int(capacity)
        if max_cache_bytes is None and os.environ.get(CACHE_LIMIT_ENV):
            max_cache_bytes = int(float(os.environ[CACHE_LIMIT_ENV]) * 2**20)
        self.max_cache_bytes = max_cache_bytes
        if self.family.extendable:
            self._get_embedding = dec.embed_positions.get_embedding
            self.positions = self._position_table(config.max_position_embeddings + self.pos_offset)
        else:
            self.positions = dec.embed_positions.weight.detach()  # (max positions (+ offset), d), shared
        self.ln_embed = getattr(dec, "layernorm_embedding", None)  # MBart
        self.final_ln = getattr(dec, "layer_norm", None)  # M2M100, MBart; Marian has none
        act = ACT2FN[config.activation_function]
        pre = self.family.pre_norm
        self.layers = nn.ModuleList(_Layer(layer, self.heads, act, pre) for layer in dec.layers)
        with torch.no_grad():
            # Cross-attention K and V of every layer in one (layers * 2 * d, d) GEMM over the encoder output.
            kv = [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj) for layer in dec.layers]
            self.cross_kv = _linear(
                torch.cat([p.weight for pair in kv for p in pair]),
                _cat_bias([(p, 1.0) for pair in kv for p in pair]),
            )

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
        size = torch.Size(shape).numel() * self.embed_weight.element_size()
        limit, source = self.max_cache_bytes, "max_cache_bytes / " + CACHE_LIMIT_ENV
        if size >= _CHECK_FREE_BYTES:
            free = _free_bytes(self.device)
            if free is not None and (limit is None or free < limit):
                limit, source = free, f"free memory on {self.device}"
        if limit is not None and size > limit:
            raise MemoryError(self._too_big(shape, what, size, f"the limit is {_size(limit)} ({source})"))
        try:
            return torch.empty(shape, dtype=self.dtype, device=self.device)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            raise MemoryError(self._too_big(shape, what, size, "the allocation failed")) from exc

    def _too_big(self, shape: tuple[int, ...], what: str, size: int, why: str) -> str:
        if what == "self-attention cache":
            layout = "(2, layers, rows, heads, positions, head_dim)"
            hint = "rows = batch x beam, positions = forced prefix + --max-len - 1"
        else:
            layout = "(2, layers, sentences, heads, source tokens, head_dim)"
            hint = "sentences = batch, source tokens = the longest source line"
        return (
            f"static decoder cache does not fit: {what} {tuple(shape)} = {_size(size)} ({layout}, "
            f"{self.dtype} on {self.device}); {why}. {hint}: lower --batch-size, --beam or --max-len"
        )

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

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, state: StaticState) -> torch.Tensor:
        """Feed one token per row (rows,); returns ``h`` (rows, d) and advances ``state`` in place."""
        pos = state.length
        if pos >= state.capacity:
            self._grow(state)
        self._ensure_positions(pos)
        tokens = tokens.to(self.device)
        x = nn.functional.embedding(tokens, self.embed_weight) * self.embed_scale  # (rows, d)
        if self.family.pad_positions:
            # create_position_ids_from_input_ids: a pad token sits at padding_idx (zero row), others count on.
            pos_ids = torch.where(tokens == self.pad_id, self.pad_id, pos + self.pos_offset)  # (rows,)
            x = x + self.positions.index_select(0, pos_ids)
        else:
            x = x + self.positions[pos + self.pos_offset]  # (d,): every row is at the same position
        if self.ln_embed is not None:
            x = self.ln_embed(x)
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

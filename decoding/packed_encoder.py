"""The encoder of a supported model (M2M100/NLLB, Marian, MBart) without computing padding.

The Hugging Face encoder runs every layer on the padded (rows, S) grid, and sorting lines by length leaves
much padding where lengths spread. :class:`PackedEncoder` runs its linears, norms and FFN on the real tokens
only, and attention per group of sentences of like length (``scaled_dot_product_attention`` on each
group's padded grid: :func:`length_groups`); the static decoder's cross-attention K/V GEMM skips padded
positions too. Its states equal the Hugging Face encoder's up to fp32 rounding (another GEMM row count;
1/sqrt(head_dim) folded into Q). What it saved: benchmarks/history/engine-notes.md and
docs/cpu-engine.md (0010).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fastvocab.decoding.model_families import (
    Family,
    HFModule,
    activation,
    embed_scale,
    fused_qkv,
    unsupported_reason,
)


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
    """One encoder layer over the *packed* real tokens (T, d): fused QKV (Q pre-scaled), attention per length
    group on a padded (rows, heads, S, hd) grid, everything else per token; weights shared with the HF layer
    except the fused QKV."""

    def __init__(self, hf_layer: HFModule, heads: int, act: nn.Module, pre_norm: bool) -> None:
        super().__init__()
        sa = hf_layer.self_attn
        d = sa.q_proj.in_features
        self.heads, self.head_dim, self.pre_norm = heads, d // heads, pre_norm
        self.qkv = fused_qkv(sa, self.head_dim**-0.5)
        self.out = sa.out_proj
        self.ln_attn, self.ln_ffn = hf_layer.self_attn_layer_norm, hf_layer.final_layer_norm
        self.fc1, self.fc2 = hf_layer.fc1, hf_layer.fc2
        # In place on fc1's fresh output: a (T, ffn) buffer not allocated and written again (a tenth of a
        # long batch's encoder time, where that buffer is larger than the cache).
        self.act = nn.ReLU(inplace=True) if isinstance(act, nn.ReLU) else act

    def forward(self, x: torch.Tensor, groups: list[LengthGroup]) -> torch.Tensor:
        """x (T, d) packed tokens; ``groups``: the batch's sentences in groups of like length."""
        if self.pre_norm:
            x = x + self._attn(self.ln_attn(x), groups)
            return x + self.fc2(self.act(self.fc1(self.ln_ffn(x))))
        x = self.ln_attn(x + self._attn(x, groups))  # post-norm (Marian)
        return self.ln_ffn(x + self.fc2(self.act(self.fc1(x))))

    def _attn(self, x: torch.Tensor, groups: list[LengthGroup]) -> torch.Tensor:
        d = x.shape[1]
        h, hd = self.heads, self.head_dim
        qkv = self.qkv(x)  # (T, 3d)
        o = qkv.new_empty((x.shape[0], d)) if len(groups) > 1 else None
        for g in groups:
            rows, s = g.key_mask.shape[0], g.key_mask.shape[-1]
            grid = x.new_zeros((rows * s, 3 * d))  # padding stays 0: finite keys/values, masked anyway
            grid.index_copy_(0, g.where, qkv if g.tokens is None else qkv.index_select(0, g.tokens))
            q, k, v = grid.view(rows, s, 3, h, hd).permute(2, 0, 3, 1, 4)  # each (rows, heads, S, hd)
            a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=g.key_mask, scale=1.0)
            a = a.transpose(1, 2).reshape(rows * s, d).index_select(0, g.where)  # (T_g, d)
            if o is None:
                return self.out(a)
            o.index_copy_(0, g.tokens, a)
        return self.out(o)


# A length group ends where a sentence is shorter than this share of the group's longest: attention's cost
# grows with rows x S^2 of the group's padded grid, and one long line in a batch sorted by length would
# otherwise pad every other sentence to its length (the en-it test split: one line of 229 tokens, the rest
# of its batch at most ~120). Groups of at most SHORT_GROUP_TOKENS never split: there a call costs more than
# the padding.
GROUP_LENGTH_SHARE = 0.7
SHORT_GROUP_TOKENS = 32


@dataclass
class LengthGroup:
    """Sentences whose attention runs on one padded grid: ``where`` (T_g,) each of their tokens' flat index
    in the (rows_g * S_g) grid, ``key_mask`` (rows_g, 1, 1, S_g) True on real tokens, ``tokens`` (T_g,) their
    index among the batch's packed tokens (None: the only group, every token in order)."""

    where: torch.Tensor
    key_mask: torch.Tensor
    tokens: torch.Tensor | None


def length_runs(lengths: Sequence[int], share: float, above: int, size: int | None = None) -> list[list[int]]:
    """Positions of ``lengths`` (longest first) in consecutive runs: a run ends before a length under
    ``share`` of the run's first, when that one is over ``above``, and at ``size`` positions (None: no
    bound). The encoder's length groups, and ``translate``'s batches."""
    runs: list[list[int]] = []
    for i, n in enumerate(lengths):
        top = lengths[runs[-1][0]] if runs else 0
        if not runs or (size is not None and len(runs[-1]) >= size) or (top > above and n < share * top):
            runs.append([])
        runs[-1].append(i)
    return runs


def length_groups(attention_mask: torch.Tensor) -> list[LengthGroup]:
    """The batch's sentences (rows of ``attention_mask``, 1 = real token) in groups of like length, longest
    first; within a group a sentence's tokens fill its row of the grid from the left, in order (attention
    reads no positions: they are in the embeddings)."""
    lengths = attention_mask.sum(1).tolist()
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    runs = length_runs([lengths[r] for r in order], GROUP_LENGTH_SHARE, SHORT_GROUP_TOKENS)
    spans = [[order[i] for i in run] for run in runs]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)  # packed tokens run row by row
    device = attention_mask.device
    if len(spans) == 1:
        where = attention_mask.reshape(-1).nonzero()[:, 0]
        return [LengthGroup(where, (attention_mask != 0)[:, None, None, :], None)]
    groups = []
    for rows in spans:
        s = lengths[rows[0]]
        tokens = torch.cat([torch.arange(starts[r], starts[r + 1], device=device) for r in rows])
        where = torch.cat([torch.arange(lengths[r], device=device) + j * s for j, r in enumerate(rows)])
        mask = (
            torch.arange(s, device=device)[None, :]
            < torch.tensor([lengths[r] for r in rows], device=device)[:, None]
        )
        groups.append(LengthGroup(where, mask[:, None, None, :], tokens))
    return groups


class PackedEncoder(nn.Module):
    """The encoder of a supported model without computing padding: the linears, layer norms and FFN run on
    the batch's real tokens only (T rows instead of rows x S), attention per length group on a padded grid.

    Positions, embedding scale, layer order and final norm follow the HF encoder of each family
    (``model_families.Family``); outputs at padded positions are zero (the decoder's
    cross-attention masks them). Same values as the HF encoder up to fp32 rounding (another GEMM row count,
    scaling folded into Q).
    """

    def __init__(self, model: HFModule) -> None:
        super().__init__()
        reason = encoder_unsupported_reason(model)
        if reason:
            raise ValueError(reason)

        config, enc = model.config, model.get_encoder()
        self.family = Family.of(model)
        self.d = config.d_model
        self.pad_id = int(config.pad_token_id)
        self.embed_weight = enc.embed_tokens.weight.detach()  # (N, d), shared
        self.embed_scale = embed_scale(enc)
        if self.family.extendable:
            self._get_embedding = enc.embed_positions.get_embedding
            self.positions = self._position_table(config.max_position_embeddings + self.family.pos_offset)
        else:
            self.positions = enc.embed_positions.weight.detach()  # (positions (+ offset), d), shared
        self.ln_embed = getattr(enc, "layernorm_embedding", None)  # MBart
        self.final_ln = getattr(enc, "layer_norm", None)  # M2M100, MBart
        act = activation(config.activation_function)
        heads = config.encoder_attention_heads
        self.layers = nn.ModuleList(_EncoderLayer(x, heads, act, self.family.pre_norm) for x in enc.layers)

    def _position_table(self, n: int) -> torch.Tensor:
        table = self._get_embedding(n, self.d, self.pad_id)
        return table.to(device=self.embed_weight.device, dtype=self.embed_weight.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(rows, S) ids and mask (1 = real token) -> hidden states (rows, S, d), zero at padding."""
        x, where = self.embed(input_ids, attention_mask)
        groups = length_groups(attention_mask)
        for layer in self.layers:
            x = layer(x, groups)
            if x.dtype == torch.float16:  # HF clamps fp16 overflow the same way after every layer
                big = torch.finfo(x.dtype).max - 1000
                x = x.clamp(-big, big)
        if self.final_ln is not None:
            x = self.final_ln(x)
        return unpacked(x, where, *input_ids.shape)

    def embed(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layers' input: the real tokens' embeddings (T, d), positions added (and MBart's norm), and
        ``where`` (T,), each token's flat index in the (rows * S) batch."""
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
        return x, where


def unpacked(x: torch.Tensor, where: torch.Tensor, rows: int, s: int) -> torch.Tensor:
    """Packed token states ``x`` (T, d) back on the (rows, S, d) grid at ``where``, zero at padding."""
    out = x.new_zeros((rows * s, x.shape[1]))
    out.index_copy_(0, where, x)
    return out.view(rows, s, x.shape[1])

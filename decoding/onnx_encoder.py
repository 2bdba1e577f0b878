"""The packed encoder's layers run by ONNX Runtime: the encoder of ``engine="onnx"`` (CPU).

:class:`~fastvocab.decoding.packed_encoder.PackedEncoder` runs ~40 torch ops a layer; at one sentence a
batch each costs more in dispatch than in work, and fbgemm's int8 linears quantise their input in a call of
their own. Here a batch's layers are one ONNX Runtime call (with ``--dtype int8`` its MatMuls dynamic int8,
as the decoder body's). The embedding stays in torch (:meth:`PackedEncoder.embed`): the graph takes the
real tokens (T, d), runs the linears, norms and FFN on them only, and attention on the batch's padded grid,
gathered from the tokens and back (one grid a batch: ``translate``'s batches are of like length). Exported
once per model beside the decoder body (``onnx_step.graph_path``); the same states as the packed encoder up
to float rounding.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from fastvocab.decoding.onnx_step import Session, export_graph, graph_path
from fastvocab.decoding.packed_encoder import PackedEncoder, unpacked


class _EncoderBody(nn.Module):
    """The packed encoder's layers as exported: inputs the real tokens ``x`` (T, d), ``grid`` (rows * S,)
    each grid position's token (T: padding, a zero row), the key ``bias`` (rows, 1, 1, S) (0, or the dtype's
    minimum at padding) and ``where`` (T,) each token's grid position; output ``h`` (T, d)."""

    def __init__(self, packed: PackedEncoder) -> None:
        super().__init__()
        from fastvocab.kernels.prepack import unpack_linears

        self.layers = copy.deepcopy(packed.layers)
        unpack_linears(self.layers)  # plain nn.Linear for the exporter
        for layer in self.layers:
            if isinstance(layer.act, nn.ReLU):
                layer.act = nn.ReLU()  # the packed encoder's runs in place; the exporter wants it plain
        self.final_ln = packed.final_ln

    def forward(self, x, grid, bias, where):
        for layer in self.layers:
            if layer.pre_norm:
                x = x + self._attn(layer, layer.ln_attn(x), grid, bias, where)
                x = x + layer.fc2(layer.act(layer.fc1(layer.ln_ffn(x))))
            else:  # post-norm (Marian)
                x = layer.ln_attn(x + self._attn(layer, x, grid, bias, where))
                x = layer.ln_ffn(x + layer.fc2(layer.act(layer.fc1(x))))
        return x if self.final_ln is None else self.final_ln(x)

    @staticmethod
    def _attn(layer, x, grid, bias, where):
        rows, s, h, hd = bias.shape[0], bias.shape[3], layer.heads, layer.head_dim
        qkv = layer.qkv(x)  # (T, 3d), Q pre-scaled
        qkv = torch.cat([qkv, torch.zeros_like(qkv[:1])])[grid]  # (rows * S, 3d), padding zero
        q, k, v = qkv.view(rows, s, 3, h, hd).permute(2, 0, 3, 1, 4)  # each (rows, heads, S, hd)
        att = torch.softmax(q @ k.transpose(2, 3) + bias, dim=-1)
        return layer.out((att @ v).transpose(1, 2).reshape(rows * s, h * hd)[where])


def export_encoder(packed: PackedEncoder, path: Path) -> None:
    """Export :class:`_EncoderBody` of ``packed`` (float32) to ``path``, shapes dynamic."""
    body = _EncoderBody(packed).eval()
    lengths = (3, 2)
    t, rows, s = sum(lengths), len(lengths), max(lengths)
    x = torch.randn(t, packed.d)
    where = torch.tensor([r * s + i for r, n in enumerate(lengths) for i in range(n)])
    grid = torch.full((rows * s,), t).index_copy_(0, where, torch.arange(t))
    bias = torch.zeros(rows, 1, 1, s)
    dynamic = {"x": {0: "T"}, "grid": {0: "G"}, "bias": {0: "rows", 3: "S"}, "where": {0: "T"}, "h": {0: "T"}}
    export_graph(body, {"x": x, "grid": grid, "bias": bias, "where": where}, ["h"], dynamic, path)


class OnnxEncoder:
    """``packed``'s layers run by ONNX Runtime, called as the packed encoder is: (rows, S) ids and mask ->
    (rows, S, d) states, zero at padding. ``int8``: the graph's int8 export (:meth:`use_int8`)."""

    def __init__(self, packed: PackedEncoder, fingerprint: str) -> None:
        self.packed = packed
        self.fingerprint = fingerprint
        self.int8 = False
        path, self.export_seconds = self._graph(int8=False)
        self.session = Session(path)

    def _graph(self, int8: bool) -> tuple[Path, float]:
        export = lambda path: export_encoder(self.packed, path)  # noqa: E731
        return graph_path("encoder", self.fingerprint, self.packed.family.name, export, int8)

    def use_int8(self) -> None:
        """Run the int8 export from now on (exported once, cached)."""
        path, spent = self._graph(int8=True)
        self.export_seconds += spent
        self.int8 = True
        self.session.reopen(path)
        self.packed.layers = nn.ModuleList()  # the graph runs them now: their float32 weights are not needed

    @property
    def path(self) -> Path:
        return self.session.path

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x, where = self.packed.embed(input_ids, attention_mask)
        rows, s = input_ids.shape
        t = x.shape[0]
        grid = torch.full((rows * s,), t).index_copy_(0, where, torch.arange(t))
        bias = torch.zeros(rows, 1, 1, s)
        bias.masked_fill_(attention_mask[:, None, None, :] == 0, torch.finfo(torch.float32).min)
        feed = {"x": x.numpy(), "grid": grid.numpy(), "bias": bias.numpy(), "where": where.numpy()}
        (h,) = self.session.get().run(None, feed)
        return unpacked(torch.from_numpy(h), where, rows, s)

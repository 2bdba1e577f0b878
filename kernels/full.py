"""The full projection ``z = h W^T + b`` over all N columns: the reference for every other method."""

from __future__ import annotations

import torch

from fastvocab.kernels.base import Projection, ProjectionOutput, register


@register("full")
class FullProjection(Projection):
    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        logits = torch.nn.functional.linear(h, self.weight, self.bias)  # (rows, N)
        return ProjectionOutput(logits=logits, ids=None, n_vocab=self.n_vocab)

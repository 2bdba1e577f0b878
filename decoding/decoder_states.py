"""What the model adapter hands the search between steps: the encoder's output for a batch
(:class:`EncoderState`), then the decoder's state with its KV cache (:class:`DecoderState`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class EncoderState:
    """Encoder output for a batch of source sentences."""

    hidden: torch.Tensor  # (rows, S, d)
    mask: torch.Tensor  # (rows, S) 1 = real token
    # Target positions the decoder will be fed at most (forced prefix + max_len - 1), when the search knows:
    # the static engine sizes its self-attention cache from it (else from cache_len, doubling as needed).
    positions: int | None = None


@dataclass
class DecoderState:
    """Everything a decoder step needs besides the new token: encoder output and the KV cache.

    Engine "hf": ``encoder`` and a transformers ``EncoderDecoderCache``. Engine "static": ``encoder`` is None
    (the cross-attention keys/values were computed from it at the first step) and ``cache`` a
    ``fastvocab.decoding.static_decoder.StaticState``.
    """

    encoder: EncoderState | None
    cache: Any
    length: int  # target tokens consumed so far

    @property
    def rows(self) -> int:
        if self.encoder is None:
            return self.cache.rows
        return self.encoder.hidden.shape[0]

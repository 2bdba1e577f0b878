"""Model adapters (HF seq2seq -> encoder, cached decoder step, exact W and b, tokenization) and greedy/beam
search written against the output-layer interface of ``fastvocab.kernels``.

The names below load on first use: ``fastvocab.decoding.settings`` imports without torch (the CLI and the
configuration read their defaults there).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastvocab.decoding.decoder_states import DecoderState, EncoderState
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.decoding.search import StepRecord, beam_search, greedy_search

# each name -> the module that defines it
_EXPORTS = {
    "DecoderState": "decoder_states",
    "EncoderState": "decoder_states",
    "Seq2SeqAdapter": "hf_adapter",
    "StepRecord": "search",
    "beam_search": "search",
    "greedy_search": "search",
}

__all__ = ["DecoderState", "EncoderState", "Seq2SeqAdapter", "StepRecord", "beam_search", "greedy_search"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

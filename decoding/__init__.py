"""Model adapters (HF seq2seq -> encoder, cached decoder step, exact W and b, tokenization) and greedy/beam
search written against the output-layer interface of ``fastvocab.kernels``.
"""

from fastvocab.decoding.hf_adapter import DecoderState, EncoderState, Seq2SeqAdapter
from fastvocab.decoding.search import StepRecord, beam_search, greedy_search

__all__ = ["DecoderState", "EncoderState", "Seq2SeqAdapter", "StepRecord", "beam_search", "greedy_search"]

"""The output-layer method a translation decodes with, built over a loaded model's exact W and b."""

from __future__ import annotations

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.kernels import create_projection
from fastvocab.kernels.base import Projection


def make_projection(adapter: Seq2SeqAdapter, method: str = "full", **options: object) -> Projection:
    """Output-layer method ``method`` over the adapter's exact W and b; EOS and language tags always on."""
    return create_projection(
        method,
        adapter.output_weight,
        adapter.output_bias,
        always_active=adapter.always_active_ids(),
        fingerprint=adapter.fingerprint,
        **options,
    )

"""The output-layer method a translation decodes with, built over a loaded model's exact W and b.

:func:`method_projection` builds it from the options a user chose (a method's options dataclass,
``kernels/options.py``), as the CLI, the bulk job, the pipeline and the Translator all do;
:func:`make_projection` from the projection's own keyword options, as the measurement harnesses and the
tests build the variants they compare (the clustered ones from :func:`clustered_options`).
"""

from __future__ import annotations

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.kernels import create_projection
from fastvocab.kernels.base import Projection
from fastvocab.kernels.clustered_parts import clustered_kwargs
from fastvocab.kernels.options import MethodOptions
from fastvocab.kernels.registry import build_projection


def make_projection(adapter: Seq2SeqAdapter, method: str = "full", **options: object) -> Projection:
    """Output-layer method ``method`` over the adapter's exact W and b, from the projection's keyword
    options; EOS and language tags always on."""
    return create_projection(
        method,
        adapter.output_weight,
        adapter.output_bias,
        always_active=adapter.always_active_ids(),
        fingerprint=adapter.fingerprint,
        **options,
    )


def method_projection(
    adapter: Seq2SeqAdapter, options: MethodOptions, *, beam: int = 1, dtype: str = "float32"
) -> Projection:
    """The method a user chose (``options``) over the adapter's exact W and b for a search at ``beam``, on a
    model loaded in ``dtype`` (``tasks.translate_job.load_decoder_model``): with int8, the full and
    clustered projections' own int8 option, so the output layer runs in int8 as the decoder's linears do;
    EOS and language tags always on."""
    return build_projection(
        options,
        adapter.output_weight,
        adapter.output_bias,
        beam=beam,
        int8=dtype == "int8",
        always_active=adapter.always_active_ids(),
        fingerprint=adapter.fingerprint,
    )


# The clustered projection's keyword options as fastvocab translate picks them at a beam, its map and
# shortlist aside (ClusteredOptions.projection_kwargs reads the same function): what a harness passes to
# make_projection.
clustered_options = clustered_kwargs

"""The run context: what the driver decides once and every worker of a run receives.

The model's fingerprint (a hash over the output projection's weights) is computed once, on the driver, by
:func:`describe_model`; workers build their adapter from the :class:`RunContext` and never hash the weights
again. The context is a small frozen dataclass, cheap to send to Ray actors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from fastvocab.artifacts_schema.fingerprint import ModelRef

log = logging.getLogger(__name__)

DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class RunContext:
    """Model identity, device, dtype and threads shared by the workers of one stage."""

    model: ModelRef
    device: str = "cpu"
    dtype: str = "float32"
    torch_threads: int | None = None
    engine: str = "auto"  # the decoder-step engine (Seq2SeqAdapter's ``engine``)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")

    def load_adapter(self):
        """Load the model on this context's device, trusting the driver's fingerprint (no re-hash)."""
        import torch
        from transformers.utils import logging as hf_logging

        from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

        hf_logging.disable_progress_bar()  # one bar per worker and model load is noise in the driver's log
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        adapter = Seq2SeqAdapter.load(
            self.model.path,
            device=self.device,
            dtype=getattr(torch, self.dtype),
            fingerprint=self.model.fingerprint,
            engine=self.engine,
        )
        if (adapter.n_vocab, adapter.d_model) != (self.model.n_vocab, self.model.d):
            raise ValueError(
                f"model {self.model.path} changed during the run: N={adapter.n_vocab}, d={adapter.d_model}, "
                f"expected N={self.model.n_vocab}, d={self.model.d}"
            )
        return adapter


def describe_model(path: str | Path, languages: tuple[str, ...] = ()) -> ModelRef:
    """Load a model folder once (CPU, fp32) and return its identity: the only place a run hashes W and b.

    ``languages`` are checked against the model first (``ValueError`` naming the valid codes).
    """
    from transformers.utils import logging as hf_logging

    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    hf_logging.disable_progress_bar()
    adapter = Seq2SeqAdapter.load(path)
    for lang in languages:
        adapter.check_language(lang)
    return ModelRef(
        path=str(Path(path).resolve()),
        fingerprint=adapter.fingerprint,
        d=int(adapter.d_model),
        n_vocab=int(adapter.n_vocab),
    )

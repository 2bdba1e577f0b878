"""How sentences are decoded: the search, its batching and its limits, as one object.

``SearchSettings`` travels from the ``fastvocab translate`` flags and the pipeline's translate section
through translation, bulk jobs and the experiments down to the search itself (``decoding.search.decode``);
its fields hold the one default of each option, which the CLI's help and the config's defaults read. This
module imports neither torch nor anything else heavy, so the CLI and the configuration load without them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

# beam search's stopping rules as generate's early_stopping names them; None: the model's own
StoppingRule = bool | Literal["never"] | None
Graphs = Literal["auto", "on", "off"]  # decoding.steppers.GRAPHS
# the decoder-step engines (decoding.hf_adapter.Seq2SeqAdapter's engine; onnx: decoding.onnx_step)
ENGINES = ("auto", "static", "hf", "onnx")


def engine_for(engine: str, graphs: str, threads: int | None = 1) -> str:
    """The engine to load for searches run with ``graphs`` by a caller that decodes one batch at a time on
    ``threads`` torch threads (None: torch's default). "auto" loads the static engine where ``graphs`` is
    "on" (the static engine's fixed-shape step, decoding.steppers, which ONNX Runtime's engine has not), or
    on more than one thread (ONNX Runtime's sessions run on one thread each; ``translate`` spreads batches
    over one-thread workers instead, and passes 1)."""
    if engine == "auto" and (graphs == "on" or threads is None or threads > 1):
        return "static"
    return engine


@dataclass(frozen=True)
class SearchSettings:
    """How sentences are decoded: search, batching and limits (``translate``'s and ``decode``'s)."""

    beam: int = 1  # 1 = greedy
    batch_size: int = 32
    max_len: int = 128  # max target tokens per sentence
    length_penalty: float = 1.0
    max_input_tokens: int = 256  # longer source lines are an error, never cut
    # beam search's stopping rule: True, False, "never" (decoding.search.beam_search); None: the model's
    early_stopping: StoppingRule = None
    # the whole decoding step in CUDA graphs: "on", "off", "auto" (decoding.steppers.use_graphs)
    graphs: Graphs = "auto"

    def plan(self) -> dict[str, object]:
        """What a translated chunk's or bulk part's plan records, so a rerun redoes it when it changed: every
        field but ``graphs``, which changes how a step runs and never what it returns."""
        fields = asdict(self)
        del fields["graphs"]
        return fields


DEFAULT_SEARCH = SearchSettings()  # every field's default (SearchSettings is frozen: one object serves all)

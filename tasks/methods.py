"""Offline artifacts of the other vocabulary-selection methods (LSH codes, HNSW graph, lexical shortlist).

Pure functions over a model's output layer (no Ray, no MLflow): :func:`build_method_index` dispatches to the
method's builder and saves the ``MethodIndex`` (``artifacts_schema/method_index.py``) atomically;
:func:`method_index_job` is the unit of work of the pipeline's methods stage (it loads the model itself, from
the run context, so the driver never holds the weights).

Every builder has one signature, ``builder(inputs: BuildInputs, params) -> MethodIndex``, with ``params``
the method's frozen parameter dataclass; ``BUILDERS`` holds them by method (the graph builder imports Faiss
when it runs; the shortlist's own code is in tasks/shortlist.py).

Work-dir layout: ``methods/<method>/<unit>/{index.safetensors,manifest.json}``, ``<unit>`` = ``all`` for an
artifact built from the output layer alone (direction ``"*"``: lsh, graph), else the direction (shortlist).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fastvocab.artifacts_schema.method_index import (
    ANY_DIRECTION,
    MethodIndex,
    load_method_index,
    save_method_index,
)
from fastvocab.kernels.graph import GraphParams, build_graph_index
from fastvocab.kernels.lsh import LshParams, build_lsh_index
from fastvocab.tasks import shortlist

log = logging.getLogger(__name__)

# Methods whose artifact depends on the output layer only: one for every direction ("*").
MODEL_WIDE = frozenset({"lsh", "graph"})
ANY_UNIT = "all"  # folder name of a model-wide artifact
METHODS_DIR = "methods"  # the artifacts' folder in a pipeline work dir


@dataclass(frozen=True)
class BuildInputs:
    """What a builder may read: the exact output layer and its fingerprint, the direction it serves, and for
    builders that learn from text, the loaded adapter (tokenizer) and the corpus folder."""

    weight: torch.Tensor  # (N, d), one vocabulary entry per row
    bias: torch.Tensor | None  # (N,) or None
    fingerprint: str
    direction: str = ANY_DIRECTION
    adapter: Any = None  # a loaded decoding.hf_adapter.Seq2SeqAdapter, when the builder needs text
    corpus_dir: Path | None = None

    @classmethod
    def from_adapter(
        cls, adapter: Any, direction: str = ANY_DIRECTION, corpus_dir: str | Path | None = None
    ) -> BuildInputs:
        return cls(
            weight=adapter.output_weight,
            bias=adapter.output_bias,
            fingerprint=adapter.fingerprint,
            direction=direction,
            adapter=adapter,
            corpus_dir=None if corpus_dir is None else Path(corpus_dir),
        )


def build_lsh(inputs: BuildInputs, params: LshParams) -> MethodIndex:
    return build_lsh_index(inputs.weight, params, fingerprint=inputs.fingerprint, direction=inputs.direction)


def build_graph(inputs: BuildInputs, params: GraphParams) -> MethodIndex:
    return build_graph_index(
        inputs.weight, inputs.bias, params, fingerprint=inputs.fingerprint, direction=inputs.direction
    )


def build_shortlist(inputs: BuildInputs, params: shortlist.ShortlistParams) -> MethodIndex:
    """The lexical shortlist of ``inputs.direction`` from the corpus's train split (tasks/shortlist.py;
    ``params``: its ``ShortlistParams``)."""
    from fastvocab.artifacts_schema.corpus import read_direction

    if inputs.adapter is None or inputs.corpus_dir is None:
        raise ValueError("a shortlist is learned from text: it needs the adapter and the corpus folder")
    src, _, tgt = inputs.direction.partition("-")
    _, sources, targets = read_direction(
        inputs.corpus_dir, src, tgt, "train", limit=getattr(params, "max_sentences", None)
    )
    return shortlist.build_shortlist(
        inputs.adapter, inputs.direction, sources, targets, params, fingerprint=inputs.fingerprint
    )


# method -> the builder of its artifact
BUILDERS: dict[str, Callable[[BuildInputs, Any], MethodIndex]] = {
    "lsh": build_lsh,
    "graph": build_graph,
    "shortlist": build_shortlist,  # one per direction, from the corpus
}
# The methods that decode with an offline artifact of their own (``--index``, the pipeline's methods stage).
INDEXED_METHODS = tuple(BUILDERS)


def builder(method: str) -> Callable[[BuildInputs, Any], MethodIndex]:
    """The builder of ``method``'s artifact; ValueError naming the valid methods for an unknown one."""
    if method not in BUILDERS:
        raise ValueError(f"no offline artifact for method {method!r}; valid: {', '.join(sorted(BUILDERS))}")
    return BUILDERS[method]


def unit_name(method: str, direction: str) -> str:
    """``all`` for a model-wide artifact, else the direction."""
    return ANY_UNIT if direction == ANY_DIRECTION else direction


def index_dir(root: str | Path, method: str, direction: str = ANY_DIRECTION) -> Path:
    """Where the pipeline keeps ``method``'s artifact for ``direction`` (``"*"``: model-wide)."""
    return Path(root) / method / unit_name(method, direction)


def index_places(path: str | Path, method: str, direction: str) -> list[Path]:
    """Where the artifact a user names by ``path`` may be, in order: the folder itself, the pipeline's
    layout under it (:func:`index_dir`), or under its ``methods/`` (a work dir)."""
    unit = ANY_DIRECTION if method in MODEL_WIDE else direction
    path = Path(path)
    return [path, index_dir(path, method, unit), index_dir(path / METHODS_DIR, method, unit)]


def directions_for(method: str, directions: list[str]) -> list[str]:
    """The artifacts a method needs for these directions: one model-wide, or one per direction."""
    return [ANY_DIRECTION] if method in MODEL_WIDE else list(directions)


def build_method_index(
    method: str,
    inputs: BuildInputs,
    params: Any,
    out_dir: str | Path | None = None,
) -> MethodIndex:
    """Build ``method``'s artifact from ``inputs`` with ``params`` (its parameter dataclass) and, when
    ``out_dir`` is given, save it there atomically."""
    if method in MODEL_WIDE and inputs.direction != ANY_DIRECTION:
        raise ValueError(f"a {method} index is built from the output layer alone: direction must be '*'")
    index = builder(method)(inputs, params)
    if out_dir is not None:
        save_method_index(index, out_dir)
    return index


def index_current(
    out_dir: str | Path, method: str, params: Any, fingerprint: str, direction: str
) -> MethodIndex | None:
    """The stored artifact when it validates (digest, model) and was built with ``params``; else None."""
    from fastvocab.artifacts_schema.errors import ArtifactError

    if not (Path(out_dir) / "manifest.json").exists():
        return None
    try:
        idx = load_method_index(out_dir, method, expect_fingerprint=fingerprint)
    except ArtifactError as exc:
        log.warning("rebuilding %s: %s", out_dir, exc)
        return None
    if idx.manifest.direction != direction or idx.manifest.params != params_dict(params):
        return None
    return idx


def method_index_job(
    run_context: Any,
    method: str,
    params: Any,
    direction: str,
    out_dir: str,
    corpus_dir: str | None = None,
) -> dict[str, Any]:
    """One artifact, as a pipeline task: load the model (``RunContext.load_adapter``), build, save.

    Returns the manifest (as a dict), the build seconds and the artifact's size in bytes.
    """
    t0 = time.perf_counter()
    adapter = run_context.load_adapter()
    inputs = BuildInputs.from_adapter(adapter, direction, corpus_dir)
    index = build_method_index(method, inputs, params, out_dir)
    files = [p for p in Path(out_dir).iterdir() if p.is_file()]
    return {
        "manifest": asdict(index.manifest),
        "seconds": time.perf_counter() - t0,
        "build_seconds": index.manifest.build_seconds,
        "bytes": sum(p.stat().st_size for p in files),
        "array_bytes": index.nbytes,
    }


def params_dict(params: Any) -> dict[str, object]:
    """Parameters as a manifest stores them (JSON values), from a parameter dataclass or a mapping."""
    raw = asdict(params) if hasattr(params, "__dataclass_fields__") else dict(params)
    return json.loads(json.dumps(raw))

"""Lexical shortlist output layer (Devlin 2017; Hoang et al. 2022's baseline; Marian ``--shortlist``,
CTranslate2 ``use_vmap``): only the target subwords that the source sentence's subwords translate into.

A sentence's candidates: the union of the table rows of its source subwords (each row the ``k`` most probable
targets by IBM-1 ``p(t | s)``), the ``frequent`` most frequent target subwords, the always-active ids (EOS,
language tags; tables built since it was added also hold the unknown token, which the model emits for
characters its vocabulary lacks) and, with ``copy`` (the default), the source subwords themselves: with a
vocabulary shared across languages, names, numbers, package names and code pass through translation as the
same ids, and IBM-1 ranks such a subword low in its own row when it is frequent elsewhere (measured on the
demo model: copy takes the greedy outputs a k 200 / frequent 2,000 shortlist changes from 7.8% to 4.8% of
en-it dev sentences, for 0.03% more columns; benchmarks/README.md, "Clustered sets plus the sentence's
shortlist").
The table is a method index built by ``tasks/shortlist.py`` for one direction and one model; any other is
refused.

The candidates depend on the *source*, which ``h`` does not carry. The search therefore binds the projection
to each batch: ``for_batch(input_ids, attention_mask)`` returns a :class:`ShortlistBatch`, a fresh object
that lives for that batch only, and the search calls it as ``bound(h, row_ids)`` with the source sentence of
every row (rows leave the batch as sentences finish; beams repeat their sentence). Nothing of a batch stays
in the projection, so consecutive batches with different candidate sets give what fresh objects give (the
CTranslate2 ``use_vmap`` bug in docs/DESIGN-NOTES.md).

``scope``: ``"sentence"`` (each row may pick only its own sentence's candidates: the batch's union of
columns is computed once, a row's foreign columns are set to ``-inf``) or ``"batch"`` (every row may pick
any candidate of the batch, Marian's and CTranslate2's behaviour). Either way ``W[union]`` is gathered once
per batch, not per step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fastvocab.artifacts_schema.digest import digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.method_index import MethodIndex, method_index_for
from fastvocab.kernels.base import Projection, ProjectionOutput, register
from fastvocab.kernels.id_sets import unique_ids
from fastvocab.kernels.options import (
    INDEX_FLAG,
    ArtifactPath,
    Flag,
    MethodOptions,
    candidates_flag,
    check_count,
    option,
    required,
)

log = logging.getLogger(__name__)

SCOPES = ("sentence", "batch")
TABLE_ARRAYS = ("indptr", "indices", "frequent", "always_active")


def _tensors_digest(table: MethodIndex) -> str:
    """The digest ``save_method_index`` records, for a table not saved yet (the signature names it)."""
    from safetensors.numpy import save

    return digest(save({name: np.ascontiguousarray(a) for name, a in table.tensors.items()}))


@dataclass(frozen=True)
class ShortlistOptions(MethodOptions):
    """What a user chooses of the shortlist method: its table (``index``, of this model and ``direction``,
    which the caller sets: a table of another direction is refused at load), the candidates per source
    subword (``k``) and the frequent subwords (``frequent``; None: all the table holds), and whether a row
    reads its own sentence's candidates or the batch's (``scope``)."""

    method: ClassVar[str] = "shortlist"

    index: ArtifactPath = required(INDEX_FLAG)
    direction: str | None = option(None)
    k: int | None = option(
        None, candidates_flag("target subwords per source subword, at most what the table holds", "all")
    )
    frequent: int | None = option(
        None,
        Flag(
            "--frequent",
            "most frequent target subwords always candidates, at most the table's",
            type=int,
            metavar="N",
            default="all",
        ),
    )
    scope: str | None = option(
        None,
        Flag(
            "--scope",
            "each row picks only from its own sentence's candidates (sentence), or from the batch's union "
            "(batch: Marian's and CTranslate2's behaviour)",
            choices=SCOPES,
            default="sentence",
        ),
    )

    def __post_init__(self) -> None:
        check_count("k", self.k, 1)
        check_count("frequent", self.frequent, 0)
        if self.scope is not None and self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}; got {self.scope!r}")


@register("shortlist", ShortlistOptions)
class ShortlistProjection(Projection):
    """Lexical shortlist over a table built for this model and direction.

    Options: ``index`` (a :class:`MethodIndex` or its folder), ``k`` (targets per source subword, at most
    what the table holds; None = all), ``frequent`` (frequent targets, likewise), ``copy`` (the source
    subwords are candidates too), ``min_prob`` (drop the table's entries below this ``p(t | s)``: shorter
    rows for frequent source subwords), ``scope`` (sentence | batch), ``direction`` ("en-it": refuse a table
    built for another; None = trust the table).

    Calling it on ``h`` alone is an error: decode through ``for_batch`` (``decoding.search`` does).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        index: MethodIndex | str | Path,
        k: int | None = None,
        frequent: int | None = None,
        copy: bool = True,
        min_prob: float = 0.0,
        scope: str = "sentence",
        direction: str | None = None,
        **common: Any,  # always_active, fingerprint: see Projection
    ) -> None:
        super().__init__(weight, bias, **common)
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}; got {scope!r}")
        self.scope = scope
        table = self._load(index, direction)
        self.index_manifest = table.manifest
        self.index_digest = table.manifest.tensors_digest or _tensors_digest(table)
        t = table.tensors
        for name, value in (("k", k), ("frequent", frequent)):
            built = table.manifest.params.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
            if isinstance(built, int) and value > built:
                raise ValueError(f"{name}={value} but the table was built with {name}={built}: rebuild it")
        self.k = k
        self.frequent = frequent
        self.copy = bool(copy)
        if not 0.0 <= min_prob < 1.0:
            raise ValueError(f"min_prob must be in [0, 1), got {min_prob!r}")
        self.min_prob = float(min_prob)
        indptr = np.asarray(t["indptr"], dtype=np.int64)
        indices = np.asarray(t["indices"], dtype=np.int64)
        if self.min_prob > 0:  # rows stay sorted by probability: keep each row's entries above the cut
            if "probs" not in t:
                raise ArtifactError("min_prob needs the table's probabilities (probs): rebuild the table")
            keep = np.asarray(t["probs"]) >= self.min_prob
            row = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
            indices = indices[keep]
            indptr = np.concatenate([[0], np.cumsum(np.bincount(row[keep], minlength=len(indptr) - 1))])
        if k is not None:  # keep the first k of each row (rows are sorted by probability)
            rank = np.arange(len(indices)) - np.repeat(indptr[:-1], np.diff(indptr))
            keep = rank < k
            indices = indices[keep]
            indptr = np.concatenate([[0], np.cumsum(np.minimum(np.diff(indptr), k))])
        self._indptr, self._indices = indptr, indices
        freq = np.asarray(t["frequent"], dtype=np.int64)[: frequent if frequent is not None else None]
        fixed = np.concatenate(
            [freq, np.asarray(t["always_active"], dtype=np.int64), self.always_active.cpu().numpy()]
        )
        self._fixed = unique_ids(fixed)  # (F,) candidates of every sentence
        if indptr.shape != (self.n_vocab + 1,) or indptr[-1] != len(indices):
            raise ArtifactError(f"corrupt shortlist table: indptr {indptr.shape} for N={self.n_vocab}")
        if any(a.size and (a.min() < 0 or a.max() >= self.n_vocab) for a in (indices, self._fixed)):
            raise ArtifactError(f"shortlist table holds ids outside [0, {self.n_vocab})")
        log.debug(
            "shortlist: %d source rows, %d entries, %d fixed candidates, scope %s",
            int((np.diff(indptr) > 0).sum()),
            len(indices),
            len(self._fixed),
            scope,
        )

    def _load(self, index: MethodIndex | str | Path, direction: str | None) -> MethodIndex:
        return method_index_for(
            index,
            "shortlist",
            fingerprint=self.fingerprint,
            n_vocab=self.n_vocab,
            d=self.d,
            direction=direction,
            required=TABLE_ARRAYS,
        )

    def options(self) -> dict[str, object]:
        m = self.index_manifest
        return {
            "k": self.k if self.k is not None else m.params.get("k"),
            "frequent": self.frequent if self.frequent is not None else m.params.get("frequent"),
            "copy": self.copy,
            **({"min_prob": self.min_prob} if self.min_prob else {}),
            "scope": self.scope,
            "direction": m.direction,
            "index": self.index_digest,
        }

    # ------------------------------------------------------------------ candidates

    def candidates(self, source_ids: Sequence[int]) -> np.ndarray:
        """Sorted candidate ids (int64) of one source sentence (ids without a row add nothing, except
        themselves with ``copy``)."""
        src = unique_ids(np.asarray(source_ids, dtype=np.int64))
        src = src[(src >= 0) & (src < self.n_vocab)]
        lo, hi = self._indptr[src], self._indptr[src + 1]
        rows = [self._indices[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]
        if self.copy:
            rows.append(src)
        return unique_ids(np.concatenate([self._fixed, *rows]))

    def for_batch(
        self, input_ids: torch.Tensor | Sequence[Sequence[int]], attention_mask: torch.Tensor | None = None
    ) -> ShortlistBatch:
        """Bind to one batch of sources: ``input_ids`` (sentences, S) padded (``attention_mask`` marks the
        real positions) or a list of id lists. The result is called as ``bound(h, row_ids)``."""
        return ShortlistBatch(self, self.batch_candidates(input_ids, attention_mask))

    def batch_candidates(
        self, input_ids: torch.Tensor | Sequence[Sequence[int]], attention_mask: torch.Tensor | None = None
    ) -> list[np.ndarray]:
        """Each source sentence's :meth:`candidates`, from ``input_ids`` as :meth:`for_batch` takes them."""
        if isinstance(input_ids, torch.Tensor):
            ids = input_ids.detach().cpu().numpy()  # (sentences, S)
            if attention_mask is None:
                seqs = list(ids)
            else:
                mask = attention_mask.detach().cpu().numpy().astype(bool)
                seqs = [row[m] for row, m in zip(ids, mask, strict=True)]
        else:
            seqs = [np.asarray(s, dtype=np.int64) for s in input_ids]
        return [self.candidates(s) for s in seqs]

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        raise ValueError(
            "the shortlist projection depends on the source sentence: bind it to a batch with "
            "for_batch(input_ids, attention_mask) and call the result with (h, row_ids) "
            "(fastvocab.decoding.search does this)"
        )


class ShortlistBatch:
    """A shortlist bound to one batch: the union of its sentences' candidates, ``W`` gathered once.

    ``sets``: per sentence its sorted candidate ids. ``bound(h, row_ids)``: ``h`` (rows, d), ``row_ids``
    (rows,) the sentence of each row (an index into ``sets``). Holds nothing that a call changes.
    """

    def __init__(self, projection: ShortlistProjection, sets: list[np.ndarray]) -> None:
        p = projection
        self.projection = p
        self.sets = sets
        self.n_vocab, self.d = p.n_vocab, p.d
        union = unique_ids(np.concatenate(sets)) if sets else p._fixed
        device = p.device
        if len(union) == p.n_vocab:  # every column: the full weight, no copy, outputs equal full softmax's
            self.ids: torch.Tensor | None = None
            self.weight, self.bias = p.weight, p.bias
        else:
            self.ids = torch.from_numpy(union).to(device)  # (C,)
            self.weight = p.weight.index_select(0, self.ids).contiguous()  # (C, d) once per batch
            self.bias = None if p.bias is None else p.bias.index_select(0, self.ids)
        self.member: torch.Tensor | None = None  # (sentences, C) True where the column is the sentence's
        if p.scope == "sentence" and len(sets) > 1:
            member = np.zeros((len(sets), len(union)), dtype=bool)
            for i, s in enumerate(sets):
                member[i, np.searchsorted(union, s)] = True
            if not member.all():
                self.member = torch.from_numpy(member).to(device)

    @property
    def columns(self) -> int:
        """Columns computed per step (the batch's union)."""
        return self.n_vocab if self.ids is None else int(self.ids.numel())

    def sizes(self) -> list[int]:
        """Candidates per sentence."""
        return [len(s) for s in self.sets]

    def __call__(self, h: torch.Tensor, row_ids: torch.Tensor) -> ProjectionOutput:
        if h.dim() != 2 or h.shape[1] != self.d:
            raise ValueError(f"hidden states must be (rows, {self.d}), got {tuple(h.shape)}")
        if row_ids.shape != (h.shape[0],):
            raise ValueError(f"row_ids must be ({h.shape[0]},), got {tuple(row_ids.shape)}")
        logits = torch.nn.functional.linear(h.to(self.weight.dtype), self.weight, self.bias)  # (rows, C)
        if self.member is not None:
            own = self.member.index_select(0, row_ids.to(self.member.device))  # (rows, C)
            logits = logits.masked_fill(~own, -math.inf)
        return ProjectionOutput(logits=logits, ids=self.ids, n_vocab=self.n_vocab, scratch=True)

"""The dump stage: decode unlabelled source sentences with the full projection and record, for every decoder
step, the hidden state ``h`` that entered the projection and the model's top-K token ids (Amer et al. 2.2).

Work is cut into deterministic shards: shard ``i`` of a direction holds sentences ``[i*S, (i+1)*S)`` of the
configured sample and is written, atomically, to ``<states>/direction=<src>-<tgt>/part-<i:05d>.parquet``. A
shard whose file exists and validates against the current plan is skipped, which makes the stage resumable
shard by shard. The schema is ``artifacts_schema.hidden_states``; each file also carries the plan it was made
from (``fastvocab.dump_plan`` schema metadata) so a changed sample or setting is detected on resume.

:class:`DumpActor` is the unit of work (STYLE habit 8): model loaded once in ``__init__``, ``__call__`` maps a
batch of columns (``sent_id``, ``text``, ``src_lang``, ``tgt_lang``) to a batch of state rows. It runs without
Ray (tests call it directly). The pipeline fans shards out as Ray tasks (:func:`dump_shard_task`) whose worker
processes keep one DumpActor each (:func:`cached_actor`): the model is loaded once per worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import ShardMeta, direction_dir, read_shard_meta, shard_table

log = logging.getLogger(__name__)

PLAN_KEY = b"fastvocab.dump_plan"
SHARD_GLOB = "part-*.parquet"
OUTPUT_COLUMNS = ("sent_id", "step", "hidden", "topk_ids", "topk_logprobs")


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


@dataclass(frozen=True)
class ShardSpec:
    """One unit of dump (or stream) work: a contiguous slice of a direction's sample."""

    direction: str
    index: int
    sent_ids: tuple[int, ...]
    texts: tuple[str, ...]
    max_states: int | None = None  # keep at most this many rows (the first ones, in sentence order)

    @property
    def src_lang(self) -> str:
        return self.direction.split("-", 1)[0]

    @property
    def tgt_lang(self) -> str:
        return self.direction.split("-", 1)[1]

    def plan(self, k: int, max_len: int, batch_size: int) -> dict[str, object]:
        """What the shard's content depends on besides the model: compared on resume."""
        h = hashlib.sha256()
        for i, t in zip(self.sent_ids, self.texts, strict=True):
            h.update(f"{i}\t{t}\n".encode())
        return {
            "direction": self.direction,
            "index": self.index,
            "sentences": len(self.sent_ids),
            "sentences_digest": "sha256:" + h.hexdigest()[:32],
            "max_states": self.max_states,
            "k": k,
            "max_len": max_len,
            "batch_size": batch_size,
        }


def plan_shards(
    direction: str,
    sent_ids: list[int],
    texts: list[str],
    shard_sentences: int,
    max_states: int | None = None,
    first_index: int = 0,
) -> list[ShardSpec]:
    """Cut a direction's sample into shards of ``shard_sentences``; a state cap is split evenly over them."""
    if len(sent_ids) != len(texts):
        raise ValueError(f"{len(sent_ids)} ids for {len(texts)} texts")
    n_shards = -(-len(texts) // shard_sentences)
    cap = None if max_states is None else -(-max_states // max(n_shards, 1))
    return [
        ShardSpec(
            direction,
            first_index + i,
            tuple(int(x) for x in sent_ids[i * shard_sentences : (i + 1) * shard_sentences]),
            tuple(texts[i * shard_sentences : (i + 1) * shard_sentences]),
            cap,
        )
        for i in range(n_shards)
    ]


class DumpActor:
    """Greedy decoding with the full projection, recording every step's ``h`` and top-K ids.

    ``__call__`` takes ``{"sent_id": (n,), "text": (n,), "src_lang": (n,), "tgt_lang": (n,)}`` and returns
    ``{"sent_id", "step", "hidden" (rows, d) fp16, "topk_ids" (rows, K) int32, "topk_logprobs" (rows, K)}``,
    rows ordered by (input row, step). Rows of different directions may be mixed in one batch.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        k: int,
        max_len: int = 128,
        batch_size: int = 32,
        device: str = "cpu",
        torch_threads: int | None = None,
    ) -> None:
        import torch
        from transformers.utils import logging as hf_logging

        from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
        from fastvocab.kernels import create_projection

        hf_logging.disable_progress_bar()  # one bar per worker and model load is noise in the driver's log
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        self.k = int(k)
        self.max_len = int(max_len)
        self.batch_size = int(batch_size)
        self.adapter = Seq2SeqAdapter.load(model_path, device=device, dtype=torch.float32)
        self.projection = create_projection("full", self.adapter.output_weight, self.adapter.output_bias)
        self.fingerprint: str = self.adapter.fingerprint
        self.d: int = int(self.adapter.d_model)
        self.n_vocab: int = int(self.adapter.n_vocab)
        if self.k > self.n_vocab:
            raise ValueError(f"dump k={self.k} exceeds the vocabulary size {self.n_vocab}")

    def shard_meta(self, direction: str) -> ShardMeta:
        return ShardMeta(model_fingerprint=self.fingerprint, d=self.d, k=self.k, direction=direction)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sent_ids = np.asarray(batch["sent_id"], dtype=np.int64)
        texts = [str(t) for t in batch["text"]]
        src = [str(x) for x in batch["src_lang"]]
        tgt = [str(x) for x in batch["tgt_lang"]]
        parts: list[dict[str, np.ndarray]] = []
        # One search per direction in the batch (the forced target tag is per call).
        for pair in sorted(set(zip(src, tgt, strict=True))):
            rows = np.array([i for i, p in enumerate(zip(src, tgt, strict=True)) if p == pair])
            for lo in range(0, len(rows), self.batch_size):
                sel = rows[lo : lo + self.batch_size]
                part = self._decode([texts[i] for i in sel], pair[0], pair[1])
                part["row"] = sel[part["row"]]
                parts.append(part)
        if not parts:
            return self._empty()
        row = np.concatenate([p["row"] for p in parts])
        step = np.concatenate([p["step"] for p in parts])
        order = np.lexsort((step, row))  # by input row, then step
        return {
            "sent_id": sent_ids[row[order]],
            "step": step[order].astype(np.int32),
            "hidden": np.concatenate([p["hidden"] for p in parts])[order],
            "topk_ids": np.concatenate([p["topk_ids"] for p in parts])[order],
            "topk_logprobs": np.concatenate([p["topk_logprobs"] for p in parts])[order],
        }

    def _empty(self) -> dict[str, np.ndarray]:
        return {
            "sent_id": np.zeros(0, np.int64),
            "step": np.zeros(0, np.int32),
            "hidden": np.zeros((0, self.d), np.float16),
            "topk_ids": np.zeros((0, self.k), np.int32),
            "topk_logprobs": np.zeros((0, self.k), np.float32),
        }

    def _decode(self, texts: list[str], src_lang: str, tgt_lang: str) -> dict[str, np.ndarray]:
        from fastvocab.decoding.search import greedy_search

        rec: dict[str, list[np.ndarray]] = {
            k: [] for k in ("row", "step", "hidden", "topk_ids", "topk_logprobs")
        }

        def hook(r) -> None:
            logp, ids = r.output.topk(self.k)  # (rows, K) best first
            rec["row"].append(r.row_ids.cpu().numpy())
            rec["step"].append(np.full(len(r.row_ids), r.step, dtype=np.int32))
            rec["hidden"].append(r.hidden.float().cpu().numpy().astype(np.float16))  # (rows, d)
            rec["topk_ids"].append(ids.cpu().numpy().astype(np.int32))
            rec["topk_logprobs"].append(logp.float().cpu().numpy())

        batch = self.adapter.encode_texts(texts, src_lang, tgt_lang)
        greedy_search(self.adapter, self.projection, batch, src_lang, tgt_lang, self.max_len, step_hook=hook)
        return {k: np.concatenate(v) for k, v in rec.items()}

    def decode_shard(self, spec: ShardSpec) -> dict[str, np.ndarray]:
        """All state rows of a shard, capped at ``spec.max_states``.

        Sentences are decoded in order of length (less padding, fewer wasted steps) and rows come back in
        sentence order. Padding can change float rounding, so the batch size is part of the shard's plan.
        """
        order = sorted(range(len(spec.texts)), key=lambda i: (len(spec.texts[i]), i))
        n = len(order)
        cols = self(
            {
                "sent_id": np.arange(n, dtype=np.int64),  # positions, mapped back below
                "text": np.array([spec.texts[i] for i in order], dtype=object),
                "src_lang": np.array([spec.src_lang] * n, dtype=object),
                "tgt_lang": np.array([spec.tgt_lang] * n, dtype=object),
            }
        )
        pos = np.asarray(order, dtype=np.int64)[cols["sent_id"]]  # input position in the shard
        resort = np.lexsort((cols["step"], pos))
        cols = {k: v[resort] for k, v in cols.items()}
        cols["sent_id"] = np.asarray(spec.sent_ids, dtype=np.int64)[pos[resort]]
        if spec.max_states is not None and len(cols["sent_id"]) > spec.max_states:
            cols = {k: v[: spec.max_states] for k, v in cols.items()}
        return cols


def write_shard(
    cols: dict[str, np.ndarray], meta: ShardMeta, plan: dict[str, object], path: Path, row_group_size: int
) -> Path:
    """Write one shard atomically, with the hidden-state schema and the plan in its metadata."""
    table = shard_table(
        meta, cols["sent_id"], cols["step"], cols["hidden"], cols["topk_ids"], cols.get("topk_logprobs")
    )
    table = table.replace_schema_metadata(
        {**table.schema.metadata, PLAN_KEY: json.dumps(plan, sort_keys=True)}
    )
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    return path


def shard_is_current(path: Path, meta: ShardMeta, plan: dict[str, object]) -> bool:
    """True when ``path`` exists, validates, and was written for this model and plan.

    A file that exists but is corrupt raises ArtifactError (one line naming it): the user decides, we do not
    silently overwrite what might be someone else's data.
    """
    if not path.exists():
        return False
    found = read_shard_meta(path)
    if found != meta:
        return False
    try:
        raw = (pq.read_schema(path).metadata or {}).get(PLAN_KEY)
        return raw is not None and json.loads(raw) == plan
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise ArtifactError(f"corrupt hidden-state shard {path}: {exc}") from exc


def stale_shards(states_root: Path, direction: str, planned: int) -> list[Path]:
    """Shard files of a direction beyond the current plan (left by a run with a larger sample)."""
    keep = {shard_name(i) for i in range(planned)}
    return [p for p in sorted(direction_dir(states_root, direction).glob(SHARD_GLOB)) if p.name not in keep]


def run_dump_shard(
    actor: DumpActor, spec: ShardSpec, states_root: Path, row_group_size: int = 50_000
) -> dict[str, object]:
    """Decode and write one shard (unless current); returns its metrics for the driver to log."""
    path = direction_dir(states_root, spec.direction) / shard_name(spec.index)
    meta = actor.shard_meta(spec.direction)
    plan = spec.plan(actor.k, actor.max_len, actor.batch_size)
    if shard_is_current(path, meta, plan):
        return {"direction": spec.direction, "index": spec.index, "skipped": True, "path": str(path)}
    t0 = time.perf_counter()
    cols = actor.decode_shard(spec)
    seconds = time.perf_counter() - t0
    write_shard(cols, meta, plan, path, row_group_size)
    rows = len(cols["sent_id"])
    log.info("dumped %s shard %d: %d states in %.1f s", spec.direction, spec.index, rows, seconds)
    return {
        "direction": spec.direction,
        "index": spec.index,
        "skipped": False,
        "path": str(path),
        "sentences": len(spec.sent_ids),
        "states": rows,
        "seconds": seconds,
        "states_per_s": rows / seconds if seconds > 0 else float("nan"),
    }


_CACHE: dict[tuple, DumpActor] = {}


def cached_actor(model_path: str | Path, **options) -> DumpActor:
    """The worker process's DumpActor for these settings, built on first use.

    Ray reuses worker processes across tasks, so the model is loaded once per worker, not once per shard;
    the same workers then serve the dump, streaming and (already warm) k-means and maps tasks.
    """
    key = (str(model_path), tuple(sorted(options.items())))
    if key not in _CACHE:
        _CACHE.clear()  # one model per process: a new setting replaces the old one
        _CACHE[key] = DumpActor(model_path, **options)
    return _CACHE[key]


def dump_shard_task(
    model_path: str, options: dict[str, object], spec: ShardSpec, states_root: str, row_group_size: int
) -> dict[str, object]:
    """Ray task body: one shard, with the worker's cached model."""
    return run_dump_shard(cached_actor(model_path, **options), spec, Path(states_root), row_group_size)

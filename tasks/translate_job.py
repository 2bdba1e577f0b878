"""One translate job for every caller: ``fastvocab translate`` and the pipeline's bulk stage (a user's input
in row-range parts, tasks/bulk.py), ``fastvocab.Translator.translate_file``, and the pipeline's translate
stage (each direction's evaluation sample, with every method in turn).

A :class:`TranslateJob` is one direction decoded with one output-layer method: the model and how it is loaded,
the method's options as a user chose them (its options dataclass, kernels/options.py, carried whole to
:func:`~fastvocab.tasks.projections.method_projection`), the search, and where the outputs go. Its
:meth:`~TranslateJob.plan` is what an output records of what it was made from, and the one resume check: an
output is current when the plan it recorded equals the job's (a bulk part in its metadata, a sample's
translations in their JSON record). A :class:`TranslateWorker` holds one model and does the jobs' work: a bulk
job's ranges, each written as a part, or a sample translated by several jobs in turn, so that their speeds
compare alike. Plain classes: the pipeline hosts the worker in Ray actors, or runs it in this process.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fastvocab.artifacts_schema.bulk_parts import part_file, part_status, write_bulk_part
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.fingerprint import ModelRef
from fastvocab.artifacts_schema.jsonfile import read_json, write_json
from fastvocab.artifacts_schema.translations import sidecar_path, write_translations
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.settings import DEFAULT_SEARCH, SearchSettings, engine_for
from fastvocab.kernels.base import Projection
from fastvocab.kernels.options import MethodOptions
from fastvocab.tasks.bulk import CUT_LINES_SHOWN, BulkRange, InputError
from fastvocab.tasks.projections import method_projection
from fastvocab.tasks.translate import LineTooLongError, translate

DTYPES = ("float32", "float16", "bfloat16", "int8")


@dataclass(frozen=True)
class TranslateJob:
    """One direction decoded with one method: what a worker needs to load the model and the method, how it
    decodes, and where the outputs go (``out``: a bulk job's parts folder, or the translations file of a
    pipeline sample).

    ``signature``: the projection's as the driver built it, which the workers' must match ("": not built
    there; a pipeline sample records what its artifacts were made from instead, ``made_from``: their
    digests as their manifests give them). ``label``: how outputs and records name the method, when not by
    its name (``clustered-shipped``: another map). ``id_type`` and ``input_root``: a bulk input's ids and the
    path its parts' files are recorded relative to.
    """

    model: ModelRef
    src_lang: str
    tgt_lang: str
    options: MethodOptions
    out: str
    search: SearchSettings = DEFAULT_SEARCH
    dtype: str = "float32"
    engine: str = "auto"  # the decoder-step engine (Seq2SeqAdapter's ``engine``)
    device: str = "cpu"
    torch_threads: int | None = None
    signature: str = ""
    made_from: dict[str, object] = field(default_factory=dict)
    label: str | None = None
    id_type: str = "int"
    input_root: str = ""

    @property
    def direction(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"

    @property
    def method(self) -> str:
        return self.options.method

    @property
    def name(self) -> str:
        return self.label or self.method

    def plan(self, rows: dict[str, object]) -> dict[str, object]:
        """What an output records and a rerun compares: the rows translated (``rows``: their file, range and
        digest), the model, the method's signature and dtype, the search settings, the direction, what the
        method's artifacts were made from where the job says, and the engine where one was named (an
        engine's int8 arithmetic is its own: an output another engine wrote is translated again)."""
        plan: dict[str, object] = {
            "input": rows,
            "model": self.model.fingerprint,
            "signature": self.signature,
            "dtype": self.dtype,
            "direction": self.direction,
            "search": self.search.plan(),
        }
        if self.made_from:
            plan["made_from"] = self.made_from
        if self.engine != "auto":  # parts written before engines were named stay reusable under "auto"
            plan["engine"] = self.engine
        return plan

    def range_plan(self, r: BulkRange) -> dict[str, object]:
        """The plan of a bulk part: its rows in their file (relative to the input the user named)."""
        return self.plan(
            {"file": _relative(r.path, self.input_root), "rows": [r.start, r.stop], "digest": r.digest}
        )

    def sample_plan(self, sources_digest: str) -> dict[str, object]:
        """The plan of a pipeline sample's translations: the digest of its source lines."""
        return self.plan({"digest": sources_digest})


def _relative(path: str, root: str) -> str:
    try:
        base = Path(root).resolve()
        return str(Path(path).relative_to(base if base.is_dir() else base.parent))
    except ValueError:
        return Path(path).name


def part_statuses(job: TranslateJob, ranges: list[BulkRange]) -> list[str]:
    """Each range's part: ``current``, ``missing``, ``stale`` or ``corrupt: ...`` (one part in memory)."""
    return [part_status(part_file(job.out, r.index), job.range_plan(r)) for r in ranges]


def sample_current(job: TranslateJob, sources_digest: str) -> bool:
    """Whether the job's translations of a sample exist with the plan the job would record."""
    found = read_json(sidecar_path(Path(job.out)))
    return (
        Path(job.out).exists() and found is not None and found.get("plan") == job.sample_plan(sources_digest)
    )


def load_decoder_model(
    path: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    engine: str = "auto",
    graphs: str = "auto",
    threads: int | None = None,
    fingerprint: str | None = None,
    languages: tuple[str, ...] = (),
) -> Seq2SeqAdapter:
    """A model as translation decodes it: the load of the bulk driver, of every translate worker and of
    ``fastvocab.Translator``, so that every one of them decodes the same model alike.

    Read without transformers' modeling code where the folder allows (``lite``: the model only decodes here,
    and that import costs seconds). ``dtype`` int8 loads float32 and quantises the linear layers at once: a
    decode pool forked later must inherit the quantised model, and a projection built later its int8
    option (:func:`~fastvocab.tasks.projections.method_projection`). ``languages`` are checked before that
    quantisation, which a wrong code would waste (``ValueError`` naming the valid codes). ``threads`` sets
    torch's threads first (None: torch's own); ``fingerprint``: the model's, when the caller knows it, so it
    is not hashed again.
    """
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    adapter = Seq2SeqAdapter.load(
        path,
        device=device,
        dtype=torch.float32 if dtype == "int8" else getattr(torch, dtype),
        fingerprint=fingerprint,
        engine=engine_for(engine, graphs),
        lite=True,
    )
    for lang in languages:
        adapter.check_language(lang)
    if dtype == "int8":
        adapter.quantize_int8()
    return adapter


def load_model(job: TranslateJob) -> Seq2SeqAdapter:
    """The job's model on its device and dtype, trusting the driver's fingerprint (no re-hash)."""
    adapter = load_decoder_model(
        job.model.path,
        job.dtype,
        job.device,
        job.engine,
        job.search.graphs,
        job.torch_threads,
        fingerprint=job.model.fingerprint,
    )
    if (adapter.n_vocab, adapter.d_model) != (job.model.n_vocab, job.model.d):
        raise ArtifactError(
            f"model {job.model.path} changed since the job was planned: N={adapter.n_vocab}, "
            f"d={adapter.d_model}, planned N={job.model.n_vocab}, d={job.model.d}"
        )
    return adapter


def job_projection(adapter: Seq2SeqAdapter, job: TranslateJob) -> Projection:
    """The job's output layer over a loaded model: its options, at its beam, in its dtype."""
    return method_projection(adapter, job.options, beam=job.search.beam, dtype=job.dtype)


class TranslateWorker:
    """Translates the work of jobs that decode one model, the model of the job it is made with: that job's
    row ranges (:meth:`translate_range`, each written as a part), or a sample with several jobs in turn
    (:meth:`translate_sample`). The model and the job's method load once, at the first piece of work (so a
    load error reaches the driver as the error it is, not as a dead worker).

    ``adapter`` and ``projection``: the job's model and method already loaded in this process (the driver's,
    when it translates the parts itself), so they are not loaded a second time.
    """

    warmup_sentences = 8  # a sample's first calls pay for allocations and lazy init: kept out of its timing

    def __init__(
        self, job: TranslateJob, adapter: Seq2SeqAdapter | None = None, projection: Projection | None = None
    ) -> None:
        self.job = job
        self.adapter = adapter
        self.projection = projection
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def _model(self) -> Seq2SeqAdapter:
        if self.adapter is None:
            self.adapter = load_model(self.job)
        return self.adapter

    def _load(self) -> tuple[Seq2SeqAdapter, Projection]:
        adapter = self._model()
        if self.projection is None:
            self.projection = job_projection(adapter, self.job)
            if self.projection.signature() != self.job.signature:
                raise ArtifactError(
                    f"the {self.job.method} method on worker {self.name} is {self.projection.signature()}, "
                    f"the job was planned with {self.job.signature} (did its map or index change?)"
                )
        return adapter, self.projection

    def translate_range(
        self, r: BulkRange, on_lines: Callable[[int], None] | None = None
    ) -> dict[str, object]:
        """Translate one range of the job's input and write its part; returns its counts for the driver.
        ``on_lines(n)``: called as each batch of ``n`` lines is done (a progress bar in the same process)."""
        adapter, projection = self._load()
        job = self.job
        t0 = time.perf_counter()
        ids, texts = r.load()
        try:
            res = translate(
                adapter,
                projection,
                texts,
                job.src_lang,
                job.tgt_lang,
                job.search,
                progress=False,
                on_lines=on_lines,
            )
        except LineTooLongError as exc:
            raise InputError(exc.at(r.path, r.start, "--max-input-tokens")) from None
        write_bulk_part(
            part_file(job.out, r.index),
            ids,
            texts,
            res.hypotheses,
            plan=job.range_plan(r),
            id_type=job.id_type,
            method=job.method,
            signature=job.signature,
            direction=job.direction,
        )
        empty = sum(1 for s, h in zip(texts, res.hypotheses, strict=True) if s.strip() and not h.strip())
        return {
            "index": r.index,
            "lines": r.lines,
            "sentences": res.sentences,
            "tokens": res.target_tokens,
            "seconds": time.perf_counter() - t0,
            "decode_seconds": res.seconds,
            "empty_outputs": empty,
            "cut_outputs": len(res.cut),
            "cut_lines": [r.first_row + i + 1 for i in res.cut[:CUT_LINES_SHOWN]],  # 1-based input lines
            "duplicate_ids": len(ids) - len(set(ids)),
            "worker": self.name,
            "engine": adapter.engine,  # the engine "auto" resolved to where the range was decoded
            "finished": time.time(),
        }

    def translate_sample(
        self, jobs: Sequence[TranslateJob], ids: Sequence[int], sources: Sequence[str], sources_digest: str
    ) -> list[dict[str, object]]:
        """Translate ``sources`` with each job in turn (one direction, this worker's model), after one warm-up
        call; write each job's translations and their JSON record (the job's plan, its signature, speed and
        the method's counts). Returns the records."""
        adapter = self._model()
        sources = list(sources)
        records: list[dict[str, object]] = []
        warm = False
        for job in jobs:
            projection = job_projection(adapter, job)
            if not warm:
                warmup = sources[: self.warmup_sentences]
                translate(adapter, projection, warmup, job.src_lang, job.tgt_lang, job.search, progress=False)
                warm = True
            res = translate(
                adapter, projection, sources, job.src_lang, job.tgt_lang, job.search, progress=False
            )
            out = Path(job.out)
            write_translations(
                out, res.hypotheses, sources=sources, ids=list(ids), direction=job.direction, method=job.name
            )
            record: dict[str, object] = {
                "method": job.name,
                "plan": job.sample_plan(sources_digest),
                "signature": projection.signature(),
                "seconds": res.seconds,
                "target_tokens": res.target_tokens,
                "sentences": res.sentences,
                "tokens_per_s": res.tokens_per_second,
                "sentences_per_s": res.sentences_per_second,
                **projection.stats(),  # active columns per row, certified share (clustered)
            }
            write_json(sidecar_path(out), record)
            records.append(record)
        return records

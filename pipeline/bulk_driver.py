"""Translation in resumable row-range parts, in this process or on N Ray actors: the driver of every
``fastvocab translate`` (a text file, Parquet, a dataset output) and of the pipeline's ``bulk`` stage.

The driver describes the input from its files, plans row-range parts (``tasks.bulk.plan_input``: digests only,
never the texts), skips every part already written with the same plan, and hands the rest to a pool of
:class:`~fastvocab.tasks.translate_job.TranslateWorker` actors that pull ranges from one queue
(``RaySession.pull_actors``): each actor loads the model and the method once, reads its own ranges and writes
their parts. A dead actor is replaced and its range retried; a part is written atomically, so a retried range
is written once. At the end a text (or single Parquet file) output is assembled from the parts in input order,
atomically; a dataset output (``-o DIR/``) keeps its parts and gets ``_manifest.json``. With one worker and no
Ray address the driver translates the parts itself, with the model it loaded to describe the job; so it does
with several workers and no Ray address for an input below ``min_ray_lines`` lines
(``ray_session.MIN_RAY_LINES``), which it decodes faster than a local Ray and its actors start. The parts are
the same either way, so either run resumes the other's.

Why parts on an actor pool and not Ray Data: a rerun after a kill must re-translate nothing that finished.
``ray.data.read_parquet -> map_batches -> write_parquet``, even with Ray Data's row-id checkpoints, started
over after a kill (its checkpoint holds written rows only, and its writer lagged the map) and took 2.4x as
long (docs/decisions/0027-bulk-parts-not-ray-data.md); row-range parts with their plan in the file's metadata
resume exactly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.bulk_parts import (
    MANIFEST,
    PART_LINES,
    assemble,
    part_counts,
    part_file,
    read_part_table,
    remove_parts_folder,
    stale_parts,
    write_manifest,
)
from fastvocab.artifacts_schema.lock import WorkDirBusy, WorkDirLock
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels.base import Projection
from fastvocab.kernels.full import FullOptions
from fastvocab.kernels.options import MethodOptions
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.extras import needed, require
from fastvocab.pipeline.ray_session import MIN_RAY_LINES
from fastvocab.pipeline.tracking import SAMPLE_ROWS, SAMPLE_TABLE, StageRecord
from fastvocab.pipeline.wording import plural
from fastvocab.tasks.bulk import (
    CUT_LINES_SHOWN,
    BulkInput,
    BulkRange,
    InputError,
    describe_input,
    input_digest,
    plan_input,
    rows_up_to,
)
from fastvocab.tasks.translate_job import TranslateJob, TranslateWorker, part_statuses

log = logging.getLogger(__name__)

# a model and its method's projection, loaded in this process (tasks.translate_job.load_decoder_model)
Loaded = tuple[Seq2SeqAdapter, Projection]


@dataclass(frozen=True)
class BulkRequest:
    """One bulk job as the user asked for it (the CLI's flags, or the config's ``bulk`` section)."""

    input: str  # text file, Parquet file, folder or glob
    output: str  # text file, .parquet file, or a dataset folder (named with a trailing / or a folder)
    model: Path
    src_lang: str
    tgt_lang: str
    # the method and its options, its map or index found and checked (kernels/options.py)
    options: MethodOptions = field(default_factory=FullOptions)
    search: SearchSettings = field(default_factory=SearchSettings)
    dtype: str = "float32"
    engine: str = "auto"  # the decoder-step engine (Seq2SeqAdapter's ``engine``)
    device: str = "cpu"
    workers: int = 1
    ray_address: str | None = None
    num_cpus_per_worker: int = 1  # CPUs (torch threads) of each Ray actor
    num_gpus_per_worker: float = 0.0
    threads: int | None = None  # torch threads in this process (no Ray); None: torch's default
    lines_per_part: int = PART_LINES
    text_column: str | None = None
    id_column: str | None = "id"
    # workers > 1 without a Ray address: an input of fewer lines is decoded in this process (0: never)
    min_ray_lines: int = MIN_RAY_LINES


@dataclass
class BulkResult:
    """What a bulk job did: counts, speed, and what a rerun found done."""

    output: Path
    lines: int = 0
    parts: int = 0
    parts_reused: int = 0
    parts_translated: int = 0
    parts_retried: int = 0
    corrupt_redone: list[str] = field(default_factory=list)
    sentences: int = 0  # non-empty lines this run translated
    reused_sentences: int = 0  # non-empty lines of the parts an earlier run translated
    tokens: int = 0  # target tokens this run generated
    empty_outputs: int = 0
    cut_outputs: int = 0  # outputs that reached search.max_len (translated by this run)
    cut_lines: list[int] = field(default_factory=list)  # the first of them, 1-based input lines
    null_texts: int = 0
    duplicate_ids: int = 0
    seconds: float = 0.0  # wall time of the translation (planning and assembly included)
    decode_seconds: float = 0.0  # the workers' time in tasks.translate.translate, summed
    # the method's counts over the parts translated in this process (Projection.stats); empty on Ray
    method_stats: dict[str, float | None] = field(default_factory=dict)
    workers: dict[str, dict[str, float]] = field(default_factory=dict)  # per worker: tokens, seconds, lines
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, tokens) per part
    params: dict[str, object] = field(default_factory=dict)
    # seconds: setup (input, model, and Ray's start when overlapped), plan, ray_start, translate, assemble
    phases: dict[str, float] = field(default_factory=dict)
    on_ray: bool = False  # the parts were given to Ray actors (False: decoded in this process)
    started_at: float | None = None  # when the job started (seconds since the epoch)
    # the first SAMPLE_ROWS lines of the output: id, source, translation (what the MLflow run shows)
    sample: dict[str, list[object]] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def load_seconds(self) -> float:
        """Before the first part: the input described and planned, the model and method loaded (Ray's
        start too, when it ran beside them)."""
        return sum(self.phases.get(k, 0.0) for k in ("setup", "plan"))

    @property
    def translate_seconds(self) -> float:
        """The parts' translation (Ray's own start excluded); the job's seconds when no phase was timed."""
        return self.phases.get("translate", self.seconds)

    @property
    def translating_tokens_per_second(self) -> float:
        """Target tokens per second of translating: what the method and the search cost, not the load."""
        return self.tokens / self.translate_seconds if self.translate_seconds > 0 else 0.0

    def throughput(self, bins: int = 40) -> tuple[float, list[float]]:
        """(bin width in s, tokens/s per bin) over the job's time, from when each part finished."""
        end = max((t for t, _ in self.timeline), default=0.0)
        if end <= 0:
            return 1.0, []
        width = max(end / bins, 1.0)
        rates = [0.0] * (int(end // width) + 1)
        for t, tokens in self.timeline:
            rates[int(t // width)] += tokens / width
        return width, rates

    def record(self, stage: str = "bulk", unit: str = "", artifacts_dir: Path | None = None) -> StageRecord:
        """The job as an MLflow record: params, metrics, the throughput series (and its plot)."""
        busy = {w: v for w, v in self.workers.items() if v["seconds"] > 0}
        metrics: dict[str, float] = {
            "lines": self.lines,
            "sentences": self.sentences,
            "sentences_reused": self.reused_sentences,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_second,
            "tokens_per_s_translating": self.translating_tokens_per_second,
            "load_seconds": self.load_seconds,
            "translate_seconds": self.translate_seconds,
            "parts": self.parts,
            "parts_reused": self.parts_reused,
            "parts_translated": self.parts_translated,
            "parts_retried": self.parts_retried,
            "corrupt_parts_redone": len(self.corrupt_redone),
            "empty_outputs": self.empty_outputs,
            "cut_outputs": self.cut_outputs,
            "null_texts": self.null_texts,
            "wall_seconds": self.seconds,
            "workers_used": len(busy),
        }
        if busy:
            rates = [v["tokens"] / v["seconds"] for v in busy.values()]
            metrics["tokens_per_s_per_worker"] = sum(rates) / len(rates)
            for i, (_, v) in enumerate(sorted(busy.items())):
                metrics[f"tokens_per_s_worker_{i}"] = v["tokens"] / v["seconds"]
        width, rates = self.throughput()
        params = dict(self.params)
        params["throughput_bin_seconds"] = round(width, 3)
        if self.corrupt_redone:
            params["corrupt_parts_redone"] = ",".join(self.corrupt_redone)
        artifacts = []
        if artifacts_dir is not None and rates:
            artifacts.append(plot_throughput(self, artifacts_dir / "throughput.png"))
        status = "ran" if self.parts_translated else "skipped"
        return StageRecord(
            stage,
            unit or str(params.get("direction", "")),
            status,
            self.summary(),
            params,
            metrics,
            series={"throughput_tokens_per_s": rates} if rates else {},
            artifacts=artifacts,
            tables={SAMPLE_TABLE: self.sample} if self.sample.get("id") else {},
            started=self.started_at,
            ended=None if self.started_at is None else self.started_at + self.seconds,
        )

    def summary(self) -> str:
        if self.lines == 0:
            return f"0 lines: the input is empty; wrote an empty output {self.output}"
        done = f"{self.parts_translated} of {self.parts} parts translated"
        if self.parts_reused:
            done += f" ({self.parts_reused} done by an earlier run)"
        tokens = f"{self.tokens} target tokens" + (" translated now" if self.parts_reused else "")
        text = (
            f"{plural(self.lines, 'line')} ({self.sentences + self.reused_sentences} non-empty, {tokens}, "
            f"{plural(self.empty_outputs, 'empty output')}); {done}"
        )
        if self.parts_retried:
            text += f", {plural(self.parts_retried, 'part')} retried after a worker died"
        if self.corrupt_redone:
            text += f"; corrupt parts redone: {', '.join(self.corrupt_redone)}"
        return text


def plot_throughput(result: BulkResult, path: Path) -> Path:
    """Tokens/s over the job's time (all workers) and lines done, as a PNG."""
    with needed():
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    width, rates = result.throughput()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    ax1.step([i * width for i in range(len(rates))], rates, where="post")
    ax1.set_xlabel("seconds since start")
    ax1.set_ylabel("target tokens/s (all workers)")
    ax1.set_title(f"bins of {width:.1f} s", fontsize=9)
    done = sorted(result.timeline)
    ax2.plot([t for t, _ in done], [sum(x for _, x in done[: i + 1]) for i in range(len(done))])
    ax2.set_xlabel("seconds since start")
    ax2.set_ylabel("target tokens done")
    fig.suptitle(f"bulk translation: {result.params.get('direction', '')}, {len(result.workers)} worker(s)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def output_layout(given: str | Path) -> tuple[str, Path]:
    """(``dataset`` | ``parquet`` | ``text``, the parts folder): a dataset output (named with a trailing
    ``/``: an existing folder named without one is refused, not filled with parts) holds its parts itself;
    a file output's parts wait in ``OUTPUT.parts/``."""
    output = Path(given)
    if str(given).endswith(("/", os.sep)):
        return "dataset", output
    return ("parquet" if output.suffix == ".parquet" else "text"), output.with_name(output.name + ".parts")


def _device(request: BulkRequest) -> str:
    """Where a worker decodes: its reserved GPU, else the requested device."""
    return "cuda" if request.num_gpus_per_worker > 0 else request.device


def _describe(request: BulkRequest, here: bool, loaded: Loaded | None = None):
    """The model's identity and the method's signature, on the driver (the workers must match it).

    ``here``: the parts are translated in this process, so the model is loaded as they decode it (device,
    dtype, threads) and returned with the method's projection for the worker, which would otherwise load
    both a second time; else a CPU float32 load only describes them. ``loaded``: the model and projection a
    caller already holds for this request (a ``Translator``'s), which describe the job and, here, decode it,
    with no load at all. A language the model lacks or an option the method refuses is a ``UserError``; a
    missing or mismatched map or index stays an ``ArtifactError``.
    """
    from fastvocab.artifacts_schema.errors import ArtifactError
    from fastvocab.artifacts_schema.fingerprint import ModelRef
    from fastvocab.tasks.projections import method_projection
    from fastvocab.tasks.translate_job import load_decoder_model

    languages = (request.src_lang, request.tgt_lang)
    try:
        if loaded is not None:
            adapter, projection = loaded
            for lang in languages:
                adapter.check_language(lang)
        elif here:
            # the model as the parts decode it: int8 quantised before the projection is built over it
            adapter = load_decoder_model(
                request.model,
                request.dtype,
                _device(request),
                request.engine,
                request.search.graphs,
                request.threads,
                languages=languages,
            )
        else:
            adapter = load_decoder_model(request.model, languages=languages)
        model = ModelRef(
            path=str(Path(request.model).resolve()),
            fingerprint=adapter.fingerprint,
            d=int(adapter.d_model),
            n_vocab=int(adapter.n_vocab),
        )
        if loaded is None:
            projection = method_projection(
                adapter, request.options, beam=request.search.beam, dtype=request.dtype
            )
    except ArtifactError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return model, projection.signature(), (adapter, projection) if here else None


def run_bulk(
    request: BulkRequest,
    *,
    ray=None,
    progress: bool = True,
    worker_cls: type = TranslateWorker,
    loaded: Loaded | None = None,
) -> BulkResult:
    """Translate ``request.input`` into ``request.output`` in parts; see the module docstring.

    ``ray``: a :class:`~fastvocab.pipeline.ray_session.RaySession` (the pipeline's); None makes one when the
    job needs Ray (``workers`` > 1 or an address), else the parts are translated in this process.
    ``worker_cls`` is the worker class hosted (tests substitute one that dies). ``loaded``: the model (loaded
    by ``tasks.translate_job.load_decoder_model`` as the request asks) and the method's projection, already in
    this process (a ``Translator``'s): they describe the job instead of a load, and decode its parts when they
    are translated here. Bad input is a ``UserError`` before anything is written: a missing file or invalid
    UTF-8 before the model loads, a language the model lacks before any part is translated. A line longer than
    ``search.max_input_tokens`` stops the job with its file and line number; the parts finished before it are
    kept for a rerun.
    """

    t0, started_at = time.perf_counter(), time.time()
    check_request(request)
    try:
        inp = describe_input(request.input, request.text_column, request.id_column)
    except InputError as exc:
        raise UserError(str(exc)) from exc
    layout, _ = output_layout(request.output)
    output = Path(request.output)
    if layout == "text" and inp.id_column is not None:
        # a text output is one line a translation, in input order: it has nowhere to keep an id
        lost = f"--output {request.output} is a text file, which keeps no ids"
        hint = f"name a Parquet file ({output.name}.parquet) or a dataset folder ({output.name}/)"
        if inp.id_type == "string":
            raise UserError(
                f"{lost}: the input's string ids (column {inp.id_column!r}) would be lost; {hint}"
            )
        log.warning("%s: the input's ids (column %r) are dropped; %s to keep them", lost, inp.id_column, hint)
    if any(Path(f.path) == output.resolve() for f in inp.files):
        raise UserError(f"--output {request.output} would overwrite the input")
    if Path(request.input).is_dir() and output.resolve().is_relative_to(Path(request.input).resolve()):
        raise UserError(f"--output {request.output} is inside the input folder {request.input}")
    on_ray = request.workers > 1 or request.ray_address is not None or ray is not None
    if on_ray and ray is None:
        here = _in_process_instead(request, inp)
        if here is not None:
            on_ray, request = False, here
    own = on_ray and ray is None
    if own:
        from fastvocab.pipeline.ray_session import RaySession

        ray = RaySession(request.ray_address, request.workers * request.num_cpus_per_worker)
    try:
        result = _run(request, inp, t0, ray, progress, worker_cls, own, loaded)
        result.started_at = started_at
        return result
    finally:
        if own:
            ray.shutdown()


def _in_process_instead(request: BulkRequest, inp: BulkInput) -> BulkRequest | None:
    """The request to decode in this process when the job is too small to pay for a local Ray (one line on
    standard error says so), else None. Only a local Ray started for the job is given up: never a cluster
    named by ``ray_address`` or ``$RAY_ADDRESS`` (``ray job submit``), nor GPU workers (the threshold is a
    CPU measurement). The process decodes with the CPUs the local Ray would have had, as threads."""
    limit = request.min_ray_lines
    if (
        limit <= 0
        or request.workers <= 1
        or request.ray_address is not None
        or os.environ.get("RAY_ADDRESS")
        or request.num_gpus_per_worker > 0
    ):
        return None
    lines = rows_up_to(inp, limit)
    if lines >= limit:
        return None
    threads = min(request.workers * request.num_cpus_per_worker, os.cpu_count() or 1)
    print(
        f"{plural(lines, 'line')}: decoding in this process with {plural(threads, 'thread')}, faster than "
        f"starting Ray for {request.workers} workers (below {limit} lines); --min-ray-lines 0 to use Ray "
        "anyway",
        file=sys.stderr,
    )
    return replace(request, threads=threads)


def _run(request, inp, t0, ray, progress, worker_cls, own, held) -> BulkResult:
    """:func:`run_bulk` once the request is checked and its Ray (if any) chosen: plan, describe the model,
    take the parts folder's lock and translate the parts. ``own``: the Ray session is this job's, not yet
    started; ``held``: the caller's loaded model and projection (``run_bulk``'s ``loaded``)."""
    layout, parts = output_layout(request.output)
    output = Path(request.output)
    phases: dict[str, float] = {}

    def prepare():
        # the input before the model: invalid UTF-8 is reported without waiting for a load
        t = time.perf_counter()
        try:
            planned = plan_input(inp, request.lines_per_part)
        except (InputError, ValueError) as exc:
            raise UserError(str(exc)) from exc
        phases["plan"] = time.perf_counter() - t
        return planned, _describe(request, here=ray is None, loaded=held)

    if own and not parts.exists():
        # a fresh job on its own Ray: start Ray while the input is planned and the model described (seconds)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            prepared = pool.submit(prepare)
            t = time.perf_counter()
            ray.ensure()
            phases["ray_start"] = time.perf_counter() - t
            (inp, ranges), (model, signature, loaded) = prepared.result()
    else:
        (inp, ranges), (model, signature, loaded) = prepare()
    if inp.nulls:
        log.warning(
            "%s: %s in column %r read as empty lines",
            inp.name,
            plural(inp.nulls, "null text"),
            inp.text_column,
        )
    job = TranslateJob(
        model,
        request.src_lang,
        request.tgt_lang,
        request.options,
        str(parts.resolve()),
        signature=signature,
        search=request.search,
        dtype=request.dtype,
        engine=request.engine,
        device=_device(request),
        torch_threads=request.num_cpus_per_worker if ray is not None else request.threads,
        id_type=inp.id_type,
        input_root=request.input,
    )
    result = BulkResult(output, lines=inp.rows, parts=len(ranges), null_texts=inp.nulls)
    result.on_ray = ray is not None
    result.params = {
        "model": str(request.model),
        "model_fingerprint": model.fingerprint,
        "direction": job.direction,
        "method": job.method,
        "signature": signature,
        "map": request.options.artifact(),
        "dtype": request.dtype,
        # the engine the model runs in this process ("auto" resolved); on Ray, as asked until the workers
        # report the engine they decoded with (_translate_parts)
        "engine": loaded[0].engine if loaded is not None else request.engine,
        "device": job.device,
        **{f"search.{k}": v for k, v in asdict(request.search).items()},
        "workers": request.workers,
        "decoded_on": "ray" if ray is not None else "process",
        "num_cpus_per_worker": request.num_cpus_per_worker,
        "num_gpus_per_worker": request.num_gpus_per_worker,
        "ray_address": request.ray_address or "",
        "input": request.input,
        "input_digest": input_digest(ranges),
        "output": str(request.output),
        "lines_per_part": request.lines_per_part,
    }
    created = not parts.exists()
    # one job per output: a second one on the same parts would redo what the first is writing
    lock = WorkDirLock(parts)
    try:
        gone = lock.acquire()
    except WorkDirBusy as exc:
        raise UserError(f"--output {output}: another job is writing its parts: {exc}") from None
    if gone is not None:
        log.warning("%s: taking over the parts of fastvocab %s, which is gone", output, gone.describe())
    try:
        planned = _Planned(inp, job, ranges, loaded, result, phases)
        return _translate_parts(request, planned, layout, parts, output, t0, ray, progress, worker_cls)
    finally:
        lock.release()
        if created:  # a job stopped before its first part leaves no empty folder behind
            with contextlib.suppress(OSError):
                parts.rmdir()


@dataclass
class _Planned:
    """A job as :func:`_run` planned it: the input described, the job the workers take, its ranges, the model
    and method loaded in this process (None when they decode on Ray), the result filled in as parts end,
    and the seconds of each phase so far."""

    inp: BulkInput
    job: TranslateJob
    ranges: list[BulkRange]
    loaded: tuple | None
    result: BulkResult
    phases: dict[str, float]


def _translate_parts(
    request: BulkRequest,
    planned: _Planned,
    layout: str,
    parts: Path,
    output: Path,
    t0: float,
    ray,
    progress: bool,
    worker_cls: type,
) -> BulkResult:
    """Translate the planned parts not yet done (in this process or on Ray) and assemble the output."""
    from tqdm.auto import tqdm

    inp, job, ranges, loaded = planned.inp, planned.job, planned.ranges, planned.loaded
    result, phases = planned.result, planned.phases

    t_check = time.perf_counter()
    # the input's and the model's description (and Ray's start, overlapped), the planning apart
    phases["setup"] = t_check - t0 - phases["plan"]
    todo = _parts_to_do(job, ranges, parts, output, result)
    parts.mkdir(parents=True, exist_ok=True)
    if todo:  # the dataset is unfinished until every part is written again
        (parts / MANIFEST).unlink(missing_ok=True)
    started = time.perf_counter()
    phases["plan"] += started - t_check  # finding the parts done is planning too
    workers: dict[str, dict[str, float]] = defaultdict(lambda: {"tokens": 0.0, "seconds": 0.0, "lines": 0.0})
    bar = tqdm(
        total=inp.rows,
        initial=inp.rows - sum(r.lines for r in todo),
        unit="line",
        desc=job.direction,
        disable=not progress or not sys.stderr.isatty(),
        file=sys.stderr,
    )

    shown = [bar.n]  # the bar before the part in progress (in this process it moves batch by batch)
    engines: set[str] = set()  # what the workers decoded with ("auto" resolved on each of them)

    def on_result(res: dict[str, Any]) -> None:
        if ray is not None:
            shown[0] = bar.n
        result.parts_translated += 1
        result.sentences += int(res["sentences"])
        result.tokens += int(res["tokens"])
        result.decode_seconds += float(res["decode_seconds"])
        result.empty_outputs += int(res["empty_outputs"])
        result.duplicate_ids += int(res["duplicate_ids"])
        if res.get("engine"):
            engines.add(str(res["engine"]))
        result.cut_outputs += int(res.get("cut_outputs", 0))
        result.cut_lines = sorted([*result.cut_lines, *res.get("cut_lines", [])])[:CUT_LINES_SHOWN]
        w = workers[str(res["worker"])]
        w["tokens"] += float(res["tokens"])
        w["seconds"] += float(res["seconds"])
        w["lines"] += float(res["lines"])
        result.timeline.append((time.perf_counter() - started, int(res["tokens"])))
        bar.update(shown[0] + int(res["lines"]) - bar.n)  # the lines not counted batch by batch

    try:
        with bar:
            if todo and ray is not None:
                result.parts_retried = _on_ray(request, job, todo, on_result, ray, worker_cls, phases)
            elif todo:
                assert loaded is not None  # described here: the model and method were loaded for it
                worker = worker_cls(job, *loaded)
                for r in todo:
                    shown[0] = bar.n
                    on_result(worker.translate_range(r, on_lines=bar.update))
                # one projection decoded every part translated: its counts are the job's
                result.method_stats = worker.projection.stats()
    except InputError as exc:  # a line too long: said with its file and line, the finished parts kept
        done = result.parts_reused + result.parts_translated
        kept = f"; {plural(done, 'finished part')} kept in {parts}/ (a rerun resumes)" if done else ""
        raise UserError(f"{exc}{kept}") from None
    phases["translate"] = time.perf_counter() - started - phases.get("ray_start_late", 0.0)
    result.workers = dict(workers)
    if engines:  # nodes without ONNX Runtime may pick another engine for "auto": each one named
        result.params["engine"] = ",".join(sorted(engines))
    _warn_of_outputs(result, inp, request.search.max_len)
    paths = [part_file(parts, r.index) for r in ranges]
    result.sample = read_sample(paths)
    _write_output(layout, parts, output, paths, bool(todo), request, planned)
    result.seconds = time.perf_counter() - t0
    late = phases.pop("ray_start_late", 0.0)
    phases["assemble"] = result.seconds - late - sum(v for k, v in phases.items() if k != "ray_start")
    result.phases = phases
    log.debug("bulk phases (s): %s", ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    return result


def _parts_to_do(
    job: TranslateJob, ranges: list[BulkRange], parts: Path, output: Path, result: BulkResult
) -> list[BulkRange]:
    """The ranges whose part is not current (missing, of another plan, or corrupt: said), the current
    ones counted into ``result``; parts beyond the plan and killed writers' temporaries removed."""
    if parts.exists():
        for stale in stale_parts(parts, len(ranges)):
            log.warning("removing %s: beyond the current plan of %d parts", stale, len(ranges))
            stale.unlink()
        _remove_temporaries(parts)
    todo = []
    for r, status in zip(ranges, part_statuses(job, ranges), strict=True):
        if status == "current":
            result.parts_reused += 1
            reused, empty = part_counts(part_file(parts, r.index))
            result.reused_sentences += reused
            result.empty_outputs += empty
            continue
        if status.startswith("corrupt"):
            name = part_file(parts, r.index).name
            log.warning("%s: part %s is corrupt (%s): redoing it", output, name, status[9:])
            result.corrupt_redone.append(name)
        todo.append(r)
    return todo


def _warn_of_outputs(result: BulkResult, inp: BulkInput, max_len: int) -> None:
    """Outputs that reached ``max_len`` (maybe cut) and ids repeated within parts, one line each."""
    if result.cut_outputs:
        lines = ", ".join(map(str, result.cut_lines))
        more = ", ..." if result.cut_outputs > len(result.cut_lines) else ""
        log.warning(
            "%s reached --max-len %d and may be cut (input lines %s%s); raise --max-len",
            plural(result.cut_outputs, "output"),
            max_len,
            lines,
            more,
        )
    if result.duplicate_ids:
        log.warning(
            "%s: ids repeat within parts (%d repeated rows); ids are not checked across parts",
            inp.name,
            result.duplicate_ids,
        )


def _write_output(
    layout: str,
    parts: Path,
    output: Path,
    paths: list[Path],
    translated: bool,
    request: BulkRequest,
    planned: _Planned,
) -> None:
    """A dataset's manifest (once its parts changed, or when it has none), or the file assembled from the
    parts in order, the parts folder then removed."""
    inp, job, result = planned.inp, planned.job, planned.result
    if layout == "dataset":
        if translated or not (parts / MANIFEST).is_file():  # a finished dataset checked again stays untouched
            write_manifest(
                parts,
                {
                    **{k: v for k, v in result.params.items() if not k.startswith("search.")},
                    "search": asdict(request.search),
                    "lines": inp.rows,
                    "parts": [p.name for p in paths],
                    "id_type": inp.id_type,
                },
            )
    else:
        assemble(
            output,
            paths,
            lines=inp.rows,
            direction=job.direction,
            method=job.method,
            id_type=inp.id_type,
        )
        remove_parts_folder(parts)


def read_sample(paths: list[Path], rows: int = SAMPLE_ROWS) -> dict[str, list[object]]:
    """The first ``rows`` lines of the parts (in order) as columns: ``id``, ``source``, ``translation``."""
    columns: dict[str, list[object]] = {"id": [], "source": [], "translation": []}
    for path in paths:
        need = rows - len(columns["id"])
        if need <= 0:
            break
        table = read_part_table(path).slice(0, need)
        for name, values in columns.items():
            values.extend(table.column(name).to_pylist())
    return columns


def _remove_temporaries(parts: Path) -> None:
    """Temporary files of writers that were killed mid-write (``atomic_path``'s ``.<name>.*.tmp``)."""
    for tmp in parts.glob(".part-*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)


def _on_ray(
    request: BulkRequest,
    job: TranslateJob,
    todo: list,
    on_result,
    ray,
    worker_cls: type,
    phases: dict[str, float],
) -> int:
    if "ray_start" not in phases:  # started here (a pipeline's session, or a rerun): time it apart
        t = time.perf_counter()
        ray.ensure()
        phases["ray_start"] = phases["ray_start_late"] = time.perf_counter() - t
    ray.require_gpus(request.num_gpus_per_worker, "--num-gpus-per-worker")
    return ray.pull_actors(
        worker_cls,
        (job,),
        "translate_range",
        todo,
        on_result,
        size=request.workers,
        num_cpus=request.num_cpus_per_worker,
        num_gpus=request.num_gpus_per_worker,
    )


def check_request(request: BulkRequest) -> None:
    """What can be refused before anything loads: counts, resources, where the output goes."""
    for flag, value, low in (
        ("--workers", request.workers, 1),
        ("--min-ray-lines", request.min_ray_lines, 0),
        ("--num-cpus-per-worker", request.num_cpus_per_worker, 1),
        ("--chunk-lines", request.lines_per_part, 1),
    ):
        if value < low:
            raise UserError(f"{flag} must be >= {low}, got {value}")
    if request.ray_address is not None:
        require(f"--ray-address {request.ray_address}", "ray")
    elif request.workers > 1:
        instead = "or drop --workers to translate in this process"
        require(f"--workers {request.workers}", "ray", instead=instead)
    if request.num_gpus_per_worker < 0:
        raise UserError(f"--num-gpus-per-worker must be >= 0, got {request.num_gpus_per_worker:g}")
    if request.dtype == "int8" and request.num_gpus_per_worker > 0:
        raise UserError(
            "--dtype int8 runs on CPU only (dynamic quantisation), not with --num-gpus-per-worker"
        )
    out = Path(request.output)
    if output_layout(request.output)[0] != "dataset":
        from fastvocab.pipeline.checks import check_output_file

        if out.is_dir():
            raise UserError(
                f"--output {out} is a folder; name it {out}/ for a Parquet dataset of parts, or give a file"
            )
        check_output_file(out, "--output")
        return
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UserError(f"--output {out}: {parent} is not a writable folder")

"""``fastvocab.Translator``: fastvocab from Python, as CTranslate2's ``Translator`` is used.

A program that translates again and again should pay for the model, the output layer and the decoding workers
once, not at every call, and should not have to know the order they must be made in (an int8 model is
quantised before a decode pool forks copies of it). A ``Translator`` loads the model once, as the bulk driver
and its workers load it (``tasks.translate_job.load_decoder_model``); builds each direction's output layer and
its :class:`~fastvocab.tasks.decode_pool.DecodePool` at the first call that needs them and keeps them; and
decides the method and the maps' shortlist tables by the rule ``fastvocab translate`` follows
(``pipeline.method_choice``), so that both give the same outputs for the same lines. ``translate_file`` is
``fastvocab translate -i -o``'s resumable path (``pipeline.bulk_driver.run_bulk``), over the model and method
already loaded.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fastvocab.artifacts_schema.bulk_parts import PART_LINES
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.settings import DEFAULT_SEARCH, ENGINES, SearchSettings
from fastvocab.kernels.base import Projection
from fastvocab.kernels.clustered_parts import ClusteredOptions
from fastvocab.kernels.full import FullOptions
from fastvocab.kernels.options import MethodOptions
from fastvocab.pipeline.bulk_driver import BulkRequest, BulkResult, run_bulk
from fastvocab.pipeline.checks import check_device, check_int8_device, untrained_direction
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.method_choice import clustered_artifacts, implied_method
from fastvocab.tasks.decode_pool import DecodePool
from fastvocab.tasks.projections import method_projection
from fastvocab.tasks.translate import translate
from fastvocab.tasks.translate_job import DTYPES, load_decoder_model


@dataclass
class _Method:
    """One output layer built over the Translator's model, the options it was built with (the bulk
    request's), and the pool that decodes with it."""

    options: MethodOptions
    projection: Projection
    pool: DecodePool


def _warn(text: str) -> None:
    # a library's warnings go where a program can filter them, not straight to standard error
    warnings.warn(text, UserWarning, stacklevel=3)


class Translator:
    """A model, loaded once, that translates lists of lines and files in any of its directions.

    ``maps``: a cluster map folder or a folder of maps (``fastvocab translate --clusters``): the clustered
    method, with the shortlist tables beside the maps where they are; without, the full projection.
    ``compute_type``: ``--dtype`` (float32, float16, bfloat16; int8, CPU only). ``engine``: ``--engine``.
    ``threads``: torch's threads in this process (``--threads``; None: torch's own), set at construction,
    for the whole process; on CPU a call decodes that many batches at once. ``workers``: Ray actors of
    :meth:`translate_file` (``--workers``; 1: in this process).

    Every refusal is a ``ValueError`` (``UserError`` or ``ArtifactError``) of one line naming the input: a
    language the model lacks, a map of another direction or model, a ``compute_type`` or ``engine`` not
    known. One call at a time: threads that translate at once each need a Translator of their own.
    """

    def __init__(
        self,
        model_dir: str | Path,
        maps: str | Path | None = None,
        compute_type: str = "float32",
        engine: str = "auto",
        device: str = "cpu",
        workers: int = 1,
        threads: int | None = None,
    ) -> None:
        # everything that can be refused is, before the model loads (seconds for a large one)
        if compute_type not in DTYPES:
            raise UserError(f"compute_type must be one of {', '.join(DTYPES)}; got {compute_type!r}")
        if engine not in ENGINES:
            raise UserError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
        if workers < 1:
            raise UserError(f"workers must be >= 1, got {workers}")
        if threads is not None and threads < 1:
            raise UserError(f"threads must be >= 1, got {threads}")
        check_int8_device(compute_type, device, "compute_type", "device")
        check_device(device, "device")
        if maps is not None and not Path(maps).is_dir():
            raise UserError(f"maps {maps}: not a folder (a cluster map folder, or a folder of maps)")
        self.model_dir = Path(model_dir)
        self.maps = None if maps is None else Path(maps)
        self.method = implied_method(None, maps)
        self.compute_type, self.device, self.workers, self.threads = compute_type, device, workers, threads
        self._engine = engine  # as asked: a bulk part records the engine only where one was named
        try:
            self._adapter: Seq2SeqAdapter = load_decoder_model(
                self.model_dir, compute_type, device, engine, DEFAULT_SEARCH.graphs, threads
            )
        except (ArtifactError, FileNotFoundError):
            raise
        except ValueError as exc:  # an engine the model's family has not
            raise UserError(str(exc)) from exc
        # by the projection's options: directions whose options are equal share an output layer and its
        # pool (the full projection serves every direction)
        self._methods: dict[tuple[tuple[str, str], ...], _Method] = {}
        # (src, tgt, beam) -> the key above: the maps' manifests are read once per direction and beam
        self._chosen: dict[tuple[str, str, int], tuple[tuple[str, str], ...]] = {}

    @property
    def engine(self) -> str:
        """The decoder-step engine the model runs (``auto`` resolved)."""
        return self._adapter.engine

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the decoding workers every direction keeps (forked processes on CPU hold their own memory
        and CPUs until then); the model stays loaded, and a later call starts them again."""
        for method in self._methods.values():
            method.pool.close()

    def translate_batch(
        self,
        lines: Sequence[str],
        src_lang: str,
        tgt_lang: str,
        beam_size: int = 1,
        batch_size: int = DEFAULT_SEARCH.batch_size,
        max_len: int = DEFAULT_SEARCH.max_len,
        length_penalty: float = DEFAULT_SEARCH.length_penalty,
        max_input_tokens: int = DEFAULT_SEARCH.max_input_tokens,
    ) -> list[str]:
        """One translation per line, in order; an empty or blank line stays empty without being decoded.

        The lines are sorted by length and batched as ``fastvocab translate`` batches them, so the same lines
        give the same outputs (a clustered union's columns depend on which lines share a batch). A line of
        more than ``max_input_tokens`` tokens is refused, never cut."""
        if isinstance(lines, str):
            raise UserError("lines is one string: pass a list of lines (one sentence each)")
        search = self._search(beam_size, batch_size, max_len, length_penalty, max_input_tokens)
        method = self._method(src_lang, tgt_lang, beam_size)
        result = translate(
            self._adapter,
            method.projection,
            list(lines),
            src_lang,
            tgt_lang,
            search,
            progress=False,
            pool=method.pool,
        )
        return result.hypotheses

    def translate_file(
        self,
        input: str | Path,
        output: str | Path,
        src_lang: str,
        tgt_lang: str,
        beam_size: int = 1,
        batch_size: int = DEFAULT_SEARCH.batch_size,
        max_len: int = DEFAULT_SEARCH.max_len,
        length_penalty: float = DEFAULT_SEARCH.length_penalty,
        max_input_tokens: int = DEFAULT_SEARCH.max_input_tokens,
        *,
        chunk_lines: int = PART_LINES,
        text_column: str | None = None,
        id_column: str | None = "id",
        ray_address: str | None = None,
        progress: bool = False,
    ) -> BulkResult:
        """Translate a text file or Parquet input into ``output`` as ``fastvocab translate -i -o`` does:
        in parts of ``chunk_lines`` lines that a rerun after a kill does not translate again, the output
        written atomically once every part is done. ``output``: a text file, a ``.parquet`` file, or a
        dataset folder named as a string ending in ``/``.

        In this process the Translator's model and output layer decode the parts (nothing loads again; the
        result's ``method_stats`` then count every call of that output layer so far); with ``workers`` > 1
        or a ``ray_address``, Ray actors load their own. Returns the job's counts and timings."""
        search = self._search(beam_size, batch_size, max_len, length_penalty, max_input_tokens)
        method = self._method(src_lang, tgt_lang, beam_size)
        request = BulkRequest(
            os.fspath(input),
            os.fspath(output),  # as given: a trailing / names a dataset folder
            self.model_dir,
            src_lang,
            tgt_lang,
            options=method.options,
            search=search,
            dtype=self.compute_type,
            engine=self._engine,
            device=self.device,
            workers=self.workers,
            ray_address=ray_address,
            num_cpus_per_worker=self.threads or 1,
            threads=self.threads,
            lines_per_part=chunk_lines,
            text_column=text_column,
            id_column=id_column,
        )
        return run_bulk(request, progress=progress, loaded=(self._adapter, method.projection))

    @staticmethod
    def _search(
        beam_size: int, batch_size: int, max_len: int, length_penalty: float, max_input_tokens: int
    ) -> SearchSettings:
        for name, value in (
            ("beam_size", beam_size),
            ("batch_size", batch_size),
            ("max_len", max_len),
            ("max_input_tokens", max_input_tokens),
        ):
            if value < 1:
                raise UserError(f"{name} must be >= 1, got {value}")
        return SearchSettings(
            beam=beam_size,
            batch_size=batch_size,
            max_len=max_len,
            length_penalty=length_penalty,
            max_input_tokens=max_input_tokens,
        )

    def _method(self, src_lang: str, tgt_lang: str, beam: int) -> _Method:
        """The output layer and pool for this direction at this beam, built at the first call that needs
        them: the beam chooses the clustered method's inactive-mass estimate, so a beam search may need an
        output layer of its own."""
        call = (src_lang, tgt_lang, beam)
        key = self._chosen.get(call)
        if key is None:
            options = self._options(src_lang, tgt_lang, beam)
            kwargs = options.projection_kwargs(beam, self.compute_type == "int8")
            key = tuple(sorted((k, str(v)) for k, v in kwargs.items()))
            if key not in self._methods:
                try:
                    projection = method_projection(self._adapter, options, beam=beam, dtype=self.compute_type)
                except ArtifactError:
                    raise
                except ValueError as exc:
                    raise UserError(str(exc)) from exc
                self._methods[key] = _Method(options, projection, DecodePool(self._adapter, projection))
            self._chosen[call] = key
        return self._methods[key]

    def _options(self, src_lang: str, tgt_lang: str, beam: int) -> MethodOptions:
        """The output layer's options for a direction, as the CLI's flags would give them (the languages
        first: an unknown code is said as such, not as a missing map)."""
        if src_lang == tgt_lang:
            raise UserError(f"src_lang and tgt_lang are both {src_lang}: nothing to translate")
        try:
            for lang in (src_lang, tgt_lang):
                self._adapter.check_language(lang)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        untrained = untrained_direction(self.model_dir, src_lang, tgt_lang)
        if untrained is not None:
            _warn(untrained)
        if self.maps is None:
            return FullOptions()
        map_dir, shortlist = clustered_artifacts(self.maps, src_lang, tgt_lang, beam=beam, warn=_warn)
        return ClusteredOptions(map_dir, shortlist=shortlist)

"""Translation of a text file of any length in chunks: bounded memory, and a rerun after a kill resumes."""

from __future__ import annotations

import itertools
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.kernels.base import Projection
from fastvocab.tasks.inputs import iter_text_lines
from fastvocab.tasks.translate import LineTooLongError, SearchSettings, TranslationResult, translate

log = logging.getLogger(__name__)

CHUNK_LINES = 10_000  # lines a chunk: the unit of memory, of progress kept after a kill, and of resume


def translate_text_file(
    adapter: Seq2SeqAdapter,
    projection: Projection,
    input_path: str | Path,
    output: str | Path,
    src_lang: str,
    tgt_lang: str,
    *,
    search: SearchSettings,
    setting: str,
    method: str,
    chunk_lines: int = CHUNK_LINES,
    progress: bool = True,
) -> TranslationResult:
    """Translate a text file of any length in chunks of ``chunk_lines`` lines, in bounded memory.

    Each finished chunk is written as a part beside ``output`` (``artifacts_schema.translations``); a rerun
    after a kill skips the parts whose plan (``setting``: what else decides the output, e.g. the projection's
    signature and dtype; the search settings; the chunk's lines) matches, and redoes a corrupt one. The output
    appears, atomically, only when every chunk is done (``method`` names the method in a Parquet output). The
    input must have been validated (UTF-8) before; the hypotheses are not returned (they are in ``output``).
    """
    from tqdm.auto import tqdm

    from fastvocab.artifacts_schema.digest import text_digest
    from fastvocab.artifacts_schema.translations import (
        assemble_parts,
        part_path,
        parts_dir,
        read_part,
        write_part,
    )

    if chunk_lines < 1:
        raise ValueError(f"chunk_lines must be >= 1, got {chunk_lines}")
    parts = parts_dir(output)
    total = sum(1 for _ in iter_text_lines(input_path))
    paths, plans = [], []
    tokens, sentences, seconds, reused, empty = 0, 0, 0.0, 0, 0
    bar = tqdm(
        total=total,
        unit="line",
        desc=f"{src_lang}-{tgt_lang}",
        disable=not progress or not sys.stderr.isatty(),
        file=sys.stderr,
    )
    lines = iter_text_lines(input_path)
    with bar:
        for index, start in enumerate(range(0, total, chunk_lines)):
            chunk = list(itertools.islice(lines, chunk_lines))
            where = f"lines {start}+{len(chunk)}|{text_digest(chunk)}"
            plan = f"{setting}|{search.plan()}|{src_lang}-{tgt_lang}|{where}"
            path = part_path(parts, index)
            paths.append(path)
            plans.append(plan)
            shown = bar.n
            if path.exists() and read_part(path, plan) is not None:
                reused += 1
            else:
                try:
                    res = translate(
                        adapter,
                        projection,
                        chunk,
                        src_lang,
                        tgt_lang,
                        **asdict(search),
                        progress=False,
                        on_lines=bar.update,  # the bar counts lines as batches finish
                    )
                except LineTooLongError as exc:
                    done = "the chunk" if index == 1 else f"the {index} chunks"
                    kept = f"; {done} before it kept in {parts}/ (a rerun resumes)" if index else ""
                    raise ValueError(exc.at(input_path, start, "--max-input-tokens") + kept) from None
                write_part(path, range(start, start + len(chunk)), chunk, res.hypotheses, plan)
                tokens, sentences, seconds = (
                    tokens + res.target_tokens,
                    sentences + res.sentences,
                    seconds + res.seconds,
                )
                empty += res.empty_outputs
            bar.update(shown + len(chunk) - bar.n)  # empty lines and reused chunks
    if reused:
        log.info("%s: %d of %d chunks were done by an earlier run", output, reused, len(paths))
    if not paths:  # an empty input: one empty part, so the output is assembled the same way
        paths.append(part_path(parts, 0))
        plans.append("empty")
        write_part(paths[0], [], [], [], "empty")
    assemble_parts(output, paths, plans, direction=f"{src_lang}-{tgt_lang}", method=method)
    return TranslationResult([], tokens, seconds, sentences, empty)

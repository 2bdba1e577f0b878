"""``fastvocab corpus``: the Debian description-translation corpus, the gettext-catalog corpus
(``--catalogs``), or your own parallel or monolingual data.

Flags override single fields of the ``corpus`` section of a config file (pipeline/config.py CorpusConfig).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fastvocab.pipeline.commands import add_examples, add_output
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.stages.corpus import build_catalogs

HELP = (
    "build a parallel corpus from Debian's description translations, from the gettext message catalogs of "
    "Debian packages, or from your own files"
)

EXAMPLES = """\
examples:
  fastvocab corpus -o data/corpus
  fastvocab corpus -o data/pool --languages en,fr,es
  fastvocab corpus --catalogs -o data/catalogs
  fastvocab corpus --catalogs --packages coreutils,tar --dev-size 500 --test-size 500
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.pipeline.config import CorpusConfig

    d = CorpusConfig()
    add_examples(p, EXAMPLES)
    config = "or the --config file's"
    p.add_argument("--config", metavar="FILE", help="a run config; its corpus section gives the defaults")
    add_output(
        p,
        f"output folder (default: {d.out_dir}, with --catalogs {d.catalogs.out_dir}, {config} "
        "corpus.out_dir or corpus.catalogs.out_dir)",
        metavar="DIR",
    )
    p.add_argument(
        "--dev-size",
        type=int,
        metavar="N",
        help=f"pairs per language pair in dev (whole documents) (default: {d.dev_size}, {config})",
    )
    p.add_argument(
        "--test-size",
        type=int,
        metavar="N",
        help=f"pairs per language pair in test (whole documents) (default: {d.test_size}, {config})",
    )
    p.add_argument(
        "--seed", type=int, metavar="N", help=f"seed of the document split (default: {d.seed}, {config})"
    )
    p.add_argument("--force", action="store_true", help="rebuild even when the outputs exist and validate")

    deb = p.add_argument_group("Debian description translations (the default source)")
    deb.add_argument(
        "--languages",
        metavar="L1,L2,...",
        help=f"languages, pivot included, --catalogs' too (default: {','.join(d.languages)}, {config})",
    )
    deb.add_argument(
        "--mono-debian",
        action="store_true",
        default=None,
        help="also write each language's descriptions as its monolingual file, mono/<lang>.parquet: the "
        "text a dump source 'mono' adds beyond the pairs (default: off, or the --config file's corpus.mono)",
    )
    deb.add_argument(
        "--lists-dir",
        metavar="DIR",
        help="apt lists folder to read, fetched into when incomplete (default: OUTPUT/apt-lists); with "
        "--catalogs, the Packages indexes' folder",
    )

    cat = p.add_argument_group(
        "gettext message catalogs (--catalogs)",
        "Pairs of English messages and their translations from the catalogs "
        "(usr/share/locale/<lang>/LC_MESSAGES/*.mo) of Debian packages: apt-get update into a private lists "
        "folder, apt-get download, dpkg-deb -x into OUTPUT (nothing installed), each package's version "
        "recorded in OUTPUT/corpus.json. pt and pt_BR both count as pt. Plural messages give their singular; "
        "placeholders at a segment's ends are stripped, a segment with one inside is dropped; accelerators "
        "and markup are removed; --help option tables are left out. The dev and test sentences of the "
        "description corpus (--hold-out) are in no split. The same layout as the descriptions', so a run "
        "config's corpus.out_dir can point at it.",
    )
    cat.add_argument(
        "--catalogs",
        action="store_true",
        help="build the catalog corpus instead of the description corpus",
    )
    cat.add_argument(
        "--packages",
        metavar="P1,P2,...",
        help=f"packages whose catalogs to read (name or name=version) (default: {len(d.catalogs.packages)} "
        f"packages, {', '.join(d.catalogs.packages[:4])}, ..., {config} corpus.catalogs.packages)",
    )
    cat.add_argument(
        "--catalogs-from-system",
        action="store_true",
        default=None,
        help=f"read this machine's own catalogs ({d.catalogs.system_dir}) instead of fetching packages "
        "(default: off, or the --config file's corpus.catalogs.from_system)",
    )
    cat.add_argument(
        "--hold-out",
        metavar="DIR",
        type=Path,
        action="append",
        help="a corpus folder whose pairs' dev and test sentences no catalog split may hold; repeat for "
        "several (default: the description corpus, corpus.out_dir, or the --config file's "
        "corpus.catalogs.hold_out)",
    )

    own = p.add_argument_group("your own data (instead of the Debian corpus)")
    src = own.add_mutually_exclusive_group()
    src.add_argument("--from-tsv", metavar="FILE", type=Path, help="parallel text: two tab-separated columns")
    src.add_argument(
        "--from-parquet", metavar="FILE", type=Path, help="parallel text: two columns of a Parquet file"
    )
    src.add_argument("--mono", metavar="FILE", type=Path, help="monolingual text, one sentence a line")
    own.add_argument("--src-lang", metavar="XX", help="language of the first (--src-col) column")
    own.add_argument("--tgt-lang", metavar="YY", help="language of the second (--tgt-col) column")
    own.add_argument("--src-col", metavar="NAME", help="Parquet column of the source text")
    own.add_argument("--tgt-col", metavar="NAME", help="Parquet column of the target text")
    own.add_argument(
        "--doc-col", metavar="NAME", help="Parquet column grouping rows into documents (optional)"
    )
    own.add_argument("--lang", metavar="XX", help="language of the --mono file")


def _flags(names: list[str]) -> str:
    return ", ".join("--" + name.replace("_", "-") for name in names)


def _check_flags(args: argparse.Namespace) -> str:
    """Which source the flags ask for; flags that do not belong to it are an error."""
    own = "tsv" if args.from_tsv else "parquet" if args.from_parquet else "mono" if args.mono else None
    if own and args.catalogs:
        raise UserError(f"--catalogs cannot be used with {'--mono' if own == 'mono' else f'--from-{own}'}")
    mode = own or ("catalogs" if args.catalogs else "debian")
    allowed = {
        "debian": {"languages", "lists_dir", "mono_debian"},
        "catalogs": {"languages", "lists_dir", "packages", "catalogs_from_system", "hold_out"},
        "tsv": {"src_lang", "tgt_lang"},
        "parquet": {"src_lang", "tgt_lang", "src_col", "tgt_col", "doc_col"},
        "mono": {"lang"},
    }[mode]
    source = {"debian": "the Debian corpus", "catalogs": "--catalogs", "mono": "--mono"}.get(
        mode, f"--from-{mode}"
    )
    specific = [
        *("languages", "lists_dir", "mono_debian", "src_lang", "tgt_lang", "src_col", "tgt_col", "doc_col"),
        *("lang", "packages", "catalogs_from_system", "hold_out"),
    ]
    wrong = [name for name in specific if getattr(args, name) is not None and name not in allowed]
    if wrong:
        raise UserError(f"{_flags(wrong)} cannot be used with {source}")
    needed = {
        "tsv": ["src_lang", "tgt_lang"],
        "parquet": ["src_lang", "tgt_lang", "src_col", "tgt_col"],
        "mono": ["lang"],
    }.get(mode, [])
    missing = [name for name in needed if getattr(args, name) is None]
    if missing:
        raise UserError(f"{source} needs {_flags(missing)}")
    return mode


def _table(headers: list[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [headers, *[[f"{c:,}" if isinstance(c, int) else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    return "\n".join(lines)


def _split_list(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _overrides(args: argparse.Namespace, mode: str) -> dict[str, object]:
    """The config keys the flags set: ``-o`` and ``--lists-dir`` are the catalog corpus's with
    ``--catalogs``."""
    section = "corpus.catalogs" if mode == "catalogs" else "corpus"
    overrides: dict[str, object] = {}
    if args.output is not None:
        overrides[f"{section}.out_dir"] = args.output
    if args.lists_dir is not None:
        overrides[f"{section}.lists_dir"] = args.lists_dir
    if args.languages is not None:
        overrides["corpus.languages"] = _split_list(args.languages)
    for name in ("dev_size", "test_size", "seed"):
        if getattr(args, name) is not None:
            overrides[f"corpus.{name}"] = getattr(args, name)
    if args.mono_debian:
        overrides["corpus.mono"] = True
    if args.packages is not None:
        overrides["corpus.catalogs.packages"] = _split_list(args.packages)
    if args.catalogs_from_system:
        overrides["corpus.catalogs.from_system"] = True
    if args.hold_out is not None:
        overrides["corpus.catalogs.hold_out"] = args.hold_out
    return overrides


def _print_catalogs(results: list, out_dir: Path) -> None:
    """Per pair: messages read, distinct pairs kept, the splits; then the packages and their versions."""
    from fastvocab.artifacts_schema.corpus import MANIFEST, SPLITS, read_manifest

    rows = [
        [
            r.name,
            r.stats.get("messages", "-"),
            r.stats.get("pairs", "-"),
            *(r.counts[s] for s in SPLITS),
            "up to date" if r.skipped else "written",
        ]
        for r in results
    ]
    print(_table(["pair", "messages", "pairs", *SPLITS, ""], rows))
    record = read_manifest(out_dir)["pairs"].get(results[0].name, {}) if results else {}
    packages = record.get("source", {}).get("packages")
    if packages:
        print("packages: " + ", ".join(f"{p['name']} {p['version']}" for p in packages))
    print(f"catalog corpus in {out_dir} ({out_dir / MANIFEST}: counts of every cleaning step)")


def run(args: argparse.Namespace) -> int:
    from fastvocab.artifacts_schema.corpus import MANIFEST, SPLITS, mono_path
    from fastvocab.pipeline.config import load_config
    from fastvocab.tasks import corpus, corpus_import

    mode = _check_flags(args)
    cfg = load_config(args.config, _overrides(args, mode)).corpus
    split = {"dev_size": cfg.dev_size, "test_size": cfg.test_size, "seed": cfg.seed}
    out_dir = cfg.catalogs.out_dir if mode == "catalogs" else cfg.out_dir

    try:
        if mode == "catalogs":
            results = build_catalogs(cfg, args.force)
        elif mode == "debian":
            results = corpus.build_debian_corpus(
                cfg.out_dir,
                cfg.languages,
                pivot=cfg.pivot,
                lists_dir=cfg.lists_dir,
                force=args.force,
                **split,
            )
            monos = [
                corpus.write_debian_mono(cfg.out_dir, cfg.lists_dir, lang, force=args.force)
                for lang in (cfg.languages if cfg.mono else [])
            ]
        elif mode == "mono":
            mono = corpus_import.import_mono(cfg.out_dir, args.mono, args.lang, force=args.force)
            state = "up to date" if mono.skipped else "written"
            print(f"{mono_path(cfg.out_dir, mono.lang)}: {mono.count:,} sentences ({state})")
            return 0
        else:
            path = args.from_tsv or args.from_parquet
            results = [
                corpus_import.import_parallel(
                    cfg.out_dir,
                    corpus_import.ParallelFile(path, mode, args.src_col, args.tgt_col, args.doc_col),
                    args.src_lang, args.tgt_lang, pivot=cfg.pivot, force=args.force, **split,
                )
            ]  # fmt: skip
    except corpus.CorpusError as exc:
        raise UserError(str(exc)) from exc

    if mode == "catalogs":
        _print_catalogs(results, out_dir)
        return 0
    rows = []
    for r in results:
        state = "up to date" if r.skipped else "written"
        pairs, dups = r.stats.get("pairs"), r.stats.get("duplicates_removed")
        unique = pairs - dups if pairs is not None and dups is not None else "-"
        rows.append([r.name, "-" if pairs is None else pairs, unique, *(r.counts[s] for s in SPLITS), state])
    print(_table(["pair", "paired", "unique", *SPLITS, ""], rows))
    if mode == "debian" and monos:
        mono_rows = [[m.lang, m.count, "up to date" if m.skipped else "written"] for m in monos]
        print(_table(["mono", "sentences", ""], mono_rows))
    print(f"corpus in {out_dir} ({out_dir / MANIFEST})")
    return 0

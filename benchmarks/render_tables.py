"""Render the results tables of the docs from the JSON records they cite.

    python benchmarks/render_tables.py --write   # or --check: exit 1 naming each doc whose tables differ

The markers a table lives between, and what the check catches: ``benchmarks/harnesses.md#render_tablespy``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "benchmarks/results"
# The markdown files that may hold tables (relative to the root; folders are searched for *.md).
DOC_PLACES = ("README.md", "docs", "benchmarks/README.md", "models/demo-maps/README.md")
MARKER = re.compile(r"<!-- table:([\w-]+) -->\n(.*?)<!-- /table:\1 -->", re.S)
DIRECTIONS = ("en-it", "it-en")


def _load(root: Path, name: str) -> dict:
    return json.loads((root / RESULTS / name).read_text())


def _sources(doc: Path, root: Path, names: list[str]) -> str:
    """The line under a table that names its records, as links relative to the doc."""
    links = [f"[{n}]({Path(os.path.relpath(root / RESULTS / n, doc.parent)).as_posix()})" for n in names]
    return f"Rendered by `benchmarks/render_tables.py` from {', '.join(links)}.\n"


def _match(entries: Iterable[dict], /, **want: object) -> dict:
    """The first of ``entries`` that holds every key of ``want`` at its value."""
    return next(r for r in entries if all(r.get(k) == v for k, v in want.items()))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |\n"


def _table(head: list[str], rows: Iterable[list[str]], align: list[str] | None = None) -> str:
    """A table and the blank line after it; ``align``: each column's ``---`` or ``---:`` (default: the first
    column left-aligned, the others right)."""
    align = align or ["---"] + ["---:"] * (len(head) - 1)
    return _row(head) + _row(align) + "".join(_row(cells) for cells in rows) + "\n"


# --- README: full against clustered + shortlist, with CTranslate2 beside (bench_peer, --engine onnx) ---

PEER_DIRECTION = "en-it"
PEER = (
    ("greedy, batch 1", "peer-cpu-2026-12-04-xeon-b1-n200.json", "beam1"),
    ("beam 4, batch 1", "peer-cpu-2026-12-04-xeon-b1-beam4-n200.json", "beam4"),
    ("greedy, batch 32", "peer-cpu-2026-12-04-xeon-b32-map-probe.json", "beam1"),
    ("beam 4, batch 32", "peer-cpu-2026-12-04-xeon-b32-map-probe.json", "beam4"),
)


def render_peer(root: Path, doc: Path) -> str:
    head = ["search, batch", "en-it lines", "full fp32 s", "clustered s", "clustered vs full",
            "CTranslate2 float32 s", "full vs CT2 float32", "clustered int8 s", "CTranslate2 int8 s",
            "clustered int8 vs CT2 int8", "outputs changed (fp32 / int8)"]  # fmt: skip
    rows = []
    for label, name, run in PEER:
        rec = _load(root, name)
        systems = rec["runs"][run]["systems"]
        full, clu = systems["fastvocab full fp32"], systems["fastvocab clustered fp32"]
        clu8 = systems["fastvocab clustered int8"]
        changed = [_pct(x["lines_changed_vs_fastvocab_full_fp32"]) for x in (clu, clu8)]
        rows.append([
            label, str(rec["n_lines"]), f"{full['seconds_median']:.2f}", f"{clu['seconds_median']:.2f}",
            f"**{clu['speed_vs_full']:.2f}x**", f"{systems['ct2 float32']['seconds_median']:.2f}",
            f"{full['speed_vs_ct2_float32']:.2f}x", f"{clu8['seconds_median']:.2f}",
            f"{systems['ct2 int8']['seconds_median']:.2f}", f"**{clu8['speed_vs_ct2_int8']:.2f}x**",
            " / ".join(changed),
        ])  # fmt: skip
    return _table(head, rows) + _sources(doc, root, list(dict.fromkeys(name for _, name, _ in PEER)))


# --- docs/methods.md: every output-layer method on the whole test split (bench methods) ---

GREEDY = "methods-cpu-2026-11-27-shipped-b1.json"
BEAM4 = "methods-cpu-2026-11-27-shipped-b4.json"
CLUSTERED_SHORTLIST = "clustered shortlist=models/demo-maps"
# a row: what it shows, the records' method label, its greedy record and its beam-4 record (or None)
METHODS: tuple[tuple[str, str, str, str | None], ...] = (
    ("clustered + shortlist, shipped maps and tables (K 1, 1 probe; k 20)", CLUSTERED_SHORTLIST, GREEDY,
     "methods-cpu-2026-11-27-hybrid-mass-b4.json"),
    ("clustered, maps K 3, 8 probes (no shortlist)", "clustered maps=runs/demo-maps-k3", GREEDY, BEAM4),
    ("shortlist k 50, frequent 2,000, batch scope", "shortlist k=50 frequent=2000 scope=batch", GREEDY, None),
    ("shortlist k 10, frequent 4,000, batch scope", "shortlist k=10 frequent=4000 scope=batch", GREEDY,
     BEAM4),
    ("shortlist k 10, frequent 4,000, sentence scope", "shortlist k=10 frequent=4000", GREEDY, None),
    ("graph (FGD), K 10, `--ef-search 256`", "graph k=10 ef_search=256", GREEDY, BEAM4),
    ("lsh, k 4,000", "lsh k=4000", "methods-cpu-2026-11-27-test-b1.json", None),
    ("clustered + shortlist, `--exact`", f"{CLUSTERED_SHORTLIST} exact=True",
     "methods-cpu-2026-11-27-exact-b1.json", "methods-cpu-2026-11-27-exact-b4.json"),
)  # fmt: skip


def _results(root: Path, name: str, label: str | None) -> dict[str, dict]:
    """A bench-methods record's result rows of one label, by direction (``None``: a bench fidelity record's
    rows, which have no label)."""
    rows = {r["direction"]: r for r in _load(root, name)["results"] if r.get("label") == label}
    if missing := [d for d in DIRECTIONS if d not in rows]:
        raise KeyError(f"{name}: no {label!r} row for {', '.join(missing)}")
    return rows


def _pair(rows: dict[str, dict], fmt: Callable[[dict], str]) -> str:
    return " / ".join(fmt(rows[d]) for d in DIRECTIONS)


def _bleu_delta(r: dict) -> str:
    delta = round(r["bleu"] - r["bleu_full"], 2)
    return "0.00" if delta == 0 else f"{delta:+.2f}"


def _speed_changed(rows: dict[str, dict]) -> list[str]:
    changed = _pair(rows, lambda r: _pct(1 - r["identical"]))
    errors = _pair(rows, lambda r: _pct(r["search_errors"]))
    return [_pair(rows, lambda r: f"{r['speed_ratio']:.2f}x"), f"{changed}, {errors}"]


def render_methods(root: Path, doc: Path) -> str:
    head = ["method, setting", "greedy: speed vs full", "greedy: changed / search errors",
            "beam 4: speed vs full", "beam 4: changed / search errors", "BLEU vs full (greedy)"]  # fmt: skip
    rows = []
    for label, method, greedy, beam in METHODS:
        g = _results(root, greedy, method)
        beam_cells = ["", ""] if beam is None else _speed_changed(_results(root, beam, method))
        rows.append([label, *_speed_changed(g), *beam_cells, _pair(g, _bleu_delta)])
    names = {name for _, _, *records in METHODS for name in records if name}
    return _table(head, rows) + _sources(doc, root, sorted(names))


# --- docs/demo-model.md: the demo model's test BLEU per direction ---

QUALITY = "demo-model-quality.json"
LANGS = ("it", "fr", "de", "es", "pt")


def render_demo_bleu(root: Path, doc: Path) -> str:
    directions = _load(root, QUALITY)["directions"]
    scores = [[f"{d['bleu']:.1f} / {d['chrf']:.1f}" for d in (directions[key.format(x)] for x in LANGS)]
              for key in ("en-{}", "{}-en")]  # fmt: skip
    rows = [["en -> xx", *scores[0]], ["xx -> en", *scores[1]]]
    return _table(["test BLEU / chrF", *LANGS], rows) + _sources(doc, root, [QUALITY])


# --- README: the maps shipped beside the demo model, one row a direction (bench fidelity, test split) ---

SHIPPED = "models/demo-maps/maps.json"  # the build record published beside the maps
# Each: beam 1 x batches 1, 32 and beam 4 x batch 8; a later record's rows replace an earlier one's (a
# direction measured again after its maps were rebuilt).
SEARCHES = ("greedy", "beam4")
# the maps rebuilt from all their text, each measured on the machine it was built on: (where, map and K);
# to-en is the X->en directions' pooled map
ALL_TEXT = (
    ("2026-12-02-zen5", "en-pt-all-text-k8"),
    ("2026-12-02-zen5", "en-es-all-text-k8"),
    ("2026-12-03-zen3", "en-fr-all-text-k8"),
    ("2026-12-03-zen3", "en-de-all-text-k8"),
    ("2026-12-04-xeon", "to-en-all-text-k8"),
    ("2026-12-04-xeon", "en-it-all-text-k3"),
    ("2026-12-04-xeon", "it-en-all-text-k8"),
)
SHIPPED_RECORDS = (
    "fidelity-cpu-2026-11-28-shipped-greedy.json",
    "fidelity-cpu-2026-11-28-shipped-beam4.json",
    "fidelity-cpu-2026-11-28-shipped-es-pt-15k-greedy.json",  # en-es, en-pt rebuilt from 15,000 lines
    "fidelity-cpu-2026-11-28-shipped-es-pt-15k-beam4.json",
    *(f"fidelity-cpu-{at}-shipped-{m}-{s}.json" for at, m in ALL_TEXT for s in SEARCHES),
)
ALL_DIRECTIONS = tuple(d for lang in LANGS for d in (f"en-{lang}", f"{lang}-en"))


def _text_of(built: dict, name: str) -> int:
    """Source lines the map was built from: of each direction it pools, the lines the dump read."""
    build = built["maps"][name]["build"]
    limit = build["settings"]["dump"]["sentences"]
    rows = [int(s["rows"]) for s in build["sources"].values()]
    return sum(r if limit == "all" else min(r, int(limit)) for r in rows)


def render_shipped(root: Path, doc: Path) -> str:
    built = json.loads((root / SHIPPED).read_text())
    rows = {
        (r["direction"], r["beam"], r["batch"]): r for n in SHIPPED_RECORDS for r in _load(root, n)["results"]
    }
    n_vocab = _load(root, SHIPPED_RECORDS[0])["meta"]["n_vocab"]
    head = ["direction", "map: source lines, states, r, K", "columns a row, b1",
            "outputs changed: b1 / b32 / beam 4", "BLEU full / clustered, b1",
            "speed vs full: b1 / b32 / beam 4"]  # fmt: skip
    # One harness a figure: the direction bench_peer measures takes its speed from the results table.
    results = f"[results table]({Path(os.path.relpath(root / 'README.md', doc.parent)).as_posix()}#results)"
    if doc.resolve() == (root / "README.md").resolve():
        results = results.replace("(README.md#", "(#")
    lines = []
    for d in ALL_DIRECTIONS:
        b1, b32, b4 = rows[(d, 1, 1)], rows[(d, 1, 32)], rows[(d, 4, 8)]
        name = (built.get("serves") or {}).get(d, {}).get("map", d)
        cols, m = b1["active_columns_per_row"], b1["map"]
        speed = " / ".join(f"{r['speed_ratio']:.2f}x" for r in (b1, b32, b4))
        lines.append([d, f"{name}: {_text_of(built, name):,}, {m['states'] / 1e6:.2f}M, {m['r']:,}, {m['k']}",
                      f"{cols:,.0f} ({_pct(cols / n_vocab)})",
                      " / ".join(_pct(1 - r["identical"]) for r in (b1, b32, b4)),
                      f"{b1['bleu_full']:.1f} / {b1['bleu']:.1f}",
                      results if d == PEER_DIRECTION else speed])  # fmt: skip
    links = _sources(doc, root, list(SHIPPED_RECORDS))
    maps = f", and [maps.json]({os.path.relpath(root / SHIPPED, doc.parent)}).\n"
    return _table(head, lines, ["---", "---", "---:", "---:", "---:", "---:"]) + links.replace(".\n", maps)


# --- docs/your-model.md: how much text the maps need (bench_data_scale, nested prefixes of the dump) ---

DATA_SCALE = "data-scale-cpu-2026-11-27.json"
DATA_POINT = {"r": 2000, "K": 3, "probes": 8, "split": "test", "paths": "both"}  # the maps of that time


def render_data_scale(root: Path, doc: Path) -> str:
    found = _load(root, DATA_SCALE)["directions"]
    head = ["dumped sentences a direction", "en-it outputs differing", "it-en",
            "a row's columns (en-it, share of N)"]  # fmt: skip
    lines = []
    for size in (1500, 6000, 24000, 96000, None):
        sizes = {d: size or found[d]["sizes"][-1] for d in DIRECTIONS}
        label = f"{size:,}" if size else "all (" + " / ".join(f"{n:,}" for n in sizes.values()) + ")"
        rows = {d: _match(found[d]["rows"], **DATA_POINT, sentences=sizes[d]) for d in DIRECTIONS}
        differ = [_pct(rows[d]["sentence_differ"]) for d in DIRECTIONS]
        lines.append([label, *differ, _pct(rows["en-it"]["row_cols"])])
    return _table(head, lines, ["---:"] * len(head)) + _sources(doc, root, [DATA_SCALE])


# --- benchmarks/README.md: what the sets and the shortlist cover, without decoding (exact at batch 1) ---

COVERAGE = "shortlist-coverage-cpu-2026-11-27.json"
COVERAGE_ROWS: tuple[tuple[str, dict], ...] = (
    ("clusters: K 3, 8 probes (the maps shipped before)", {"method": "clustered", "K": 3, "probes": 8}),
    ("clusters: K 1, 1 probe", {"method": "clustered", "K": 1, "probes": 1}),
    ("shortlist: k 20, no frequent list", {"method": "shortlist", "k": 20, "frequent": 0, "copy": True}),
    ("shortlist: k 10, frequent 4,000", {"method": "shortlist", "k": 10, "frequent": 4000, "copy": True}),
    (
        "**both: K 1, 1 probe + k 20 (shipped)**",
        {"method": "both", "K": 1, "probes": 1, "k": 20, "frequent": 0},
    ),
    ("both: K 1, 2 probes + k 10", {"method": "both", "K": 1, "probes": 2, "k": 10, "frequent": 0}),
)


def _share(x: float) -> str:
    return f"{100 * x:.2f}%" if x < 0.01 else _pct(x)


def render_coverage(root: Path, doc: Path) -> str:
    found = _load(root, COVERAGE)["directions"]
    head = ["what a step computes", "changed, dev (en-it / it-en)", "changed, test", "a row, test",
            "union 32, test"]  # fmt: skip
    lines = []
    for label, want in COVERAGE_ROWS:

        def cell(split: str, key: str, fmt: Callable[[float], str] = _pct, want: dict = want) -> str:
            return " / ".join(fmt(_match(found[d]["rows"], split=split, **want)[key]) for d in DIRECTIONS)

        cells = [cell("dev", "sentence_differ"), cell("test", "sentence_differ")]
        cells += [cell("test", "row_cols", _share), cell("test", "union_batch")]
        bold = label.startswith("**")
        lines.append([label, *(f"**{c}**" if bold else c for c in cells)])
    return _table(head, lines) + _sources(doc, root, [COVERAGE])


# --- benchmarks/README.md: the shipped en-it / it-en maps and tables on the whole test split ---

SHIPPED_TEST = (
    ("greedy, 1", "fidelity-cpu-2026-11-27-shipped-shortlist-b1.json", None),
    ("greedy, 32", "methods-cpu-2026-11-27-shipped-b1.json", "clustered shortlist=models/demo-maps"),
    ("beam 4, 8", "methods-cpu-2026-11-27-hybrid-mass-b4.json", "clustered shortlist=models/demo-maps"),
)


def render_shipped_test(root: Path, doc: Path) -> str:
    # No speed column: one harness a figure, and the speed of this setting is the README's results table's.
    head = ["search, batch", "changed (en-it / it-en)", "search errors", "BLEU full -> clustered + shortlist"]
    lines = []
    for label, name, method in SHIPPED_TEST:
        rows = _results(root, name, method)
        lines.append([label, _pair(rows, lambda r: _pct(1 - r["identical"])),
                      _pair(rows, lambda r: _pct(r["search_errors"])),
                      _pair(rows, lambda r: f"{r['bleu_full']:.2f} -> {r['bleu']:.2f}")])  # fmt: skip
    align = ["---", "---:", "---:", "---"]
    return _table(head, lines, align) + _sources(doc, root, [name for _, name, _ in SHIPPED_TEST])


# --- benchmarks/README.md: scale (generated inputs of millions of lines; bench_scale.py, retired) ---

SCALE = ("scale-2026-11-23.json", "scale-2026-11-23-plan.json", "scale-2026-11-23-translate-1m.json")
STREAM = "scale-2026-11-27-dump-stream.json"


def _lines(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}K"


def render_scale(root: Path, doc: Path) -> str:
    rows = {(r["kind"], r["lines"]): r for name in (*SCALE, STREAM) for r in _load(root, name)["rows"]}
    lines = []
    for kind, label in (("mono", "`fastvocab corpus --mono`"), ("tsv", "`fastvocab corpus --from-tsv`")):
        r = rows[(kind, 20_000_000)]
        gb = f"{r['file_mb'] / 1024:.1f} GB"
        lines.append(
            [f"{label} ({gb})", _lines(r["lines"]), f"{r['seconds']:.0f}", f"{r['peak_rss_mb']:,.0f} MB"]
        )
    r = rows[("dump-plan", 20_000_000)]
    shards = f"{r['sentences'] // r['shards']}-sentence shards"
    lines.append([f"dump planner ({shards})", "20M", f"{r['seconds']:.0f}", f"{r['peak_rss_mb']:,.0f} MB"])
    first, resumed = (rows[("translate-kill-resume", 1_000_000)][k] for k in ("first_run", "resume_run"))
    lines.append(["`fastvocab translate`, tiny model, SIGKILLed at half, then resumed", "1M",
                  f"{first['seconds']:,.0f} + {resumed['seconds']:,.0f}",
                  f"{first['peak_rss_mb']:.0f} / {resumed['peak_rss_mb']:.0f} MB"])  # fmt: skip
    streamed = [rows[("dump-stream", n)] for n in (100_000, 1_000_000)]
    stored = f"{streamed[0]['stored_sentences']:,} sentences stored"
    lines.append([f"streamed dump (tiny model, {stored}, the rest counted)",
                  " / ".join(_lines(r["lines"]) for r in streamed),
                  " / ".join(f"{r['seconds']:.0f}" for r in streamed),
                  " / ".join(f"{r['driver_peak_rss_mb']:.0f}" for r in streamed) + " MB"])  # fmt: skip
    head, align = ["command", "lines", "seconds", "peak RSS"], ["---", "---:", "---:", "---:"]
    return _table(head, lines, align) + _sources(doc, root, [*SCALE, STREAM])


# --- models/demo-maps/README.md: what the two all-text maps hold (maps.json, the manifests, the files) ---

MAPS_DIR = "models/demo-maps"


def _mib(folder: Path) -> str:
    return f"{sum(f.stat().st_size for f in folder.glob('*.zst')) / 2**20:.1f} MiB"


def render_card(root: Path, doc: Path) -> str:
    maps = root / MAPS_DIR
    built = json.loads((maps / "maps.json").read_text())
    cols: dict[str, list[str]] = {}
    for d in DIRECTIONS:
        entry, stats = built["maps"][d], built["maps"][d]["build"]["sources"][d]["stats"]
        manifest = json.loads((maps / d / "manifest.json").read_text())
        table = json.loads((maps / "shortlist" / d / "manifest.json").read_text())
        states, frac, n = entry["beam_states"], manifest["active_fraction"], manifest["n_vocab"]
        frequent = table["params"]["frequent"]
        cols[d] = [
            " + ".join(f"{stats.get(part, {}).get('kept', 0):,}" for part in ("train", "catalogs", "mono")),
            f"{stats['mono']['held_out']:,}",
            f"{states['0']:,} / {states['1']:,}",
            f"{entry['r']:,}, {entry['k']}, {entry['probes']}",
            f"{100 * frac['mean']:.2f}% / {100 * frac['max']:.2f}%",
            str(entry["normaliser_rank"]),
            _mib(maps / d),
            f"{table['params']['k']}, {frequent or 'none'}, {table['extra']['source_types']:,}",
            _mib(maps / "shortlist" / d),
        ]
    labels = ["source lines: train + catalogs + monolingual (after de-duplication)",
              "monolingual lines left out: they are dev or test lines",
              "dumped states: reference path / greedy path", "clusters r, top-K per state, probes",
              f"set size, mean / largest (share of the {n:,} ids)",
              "normaliser rank (beam search's mass estimate)", "map size (compact form, zstd)",
              "shortlist: targets per source subword, frequent list, source subwords with a row",
              "shortlist size (compact form, zstd)"]  # fmt: skip
    out = "| | " + " | ".join(DIRECTIONS) + " |\n" + _row(["---", "---:", "---:"])
    out += "".join(_row([label, *cells]) for label, *cells in zip(labels, *cols.values(), strict=True))
    rel = Path(os.path.relpath(maps / "maps.json", doc.parent)).as_posix()
    return out + f"\nRendered by `benchmarks/render_tables.py` from [maps.json]({rel}) and the manifests.\n"


# --- docs/corpus.md: the Debian corpus by pair (fastvocab corpus's own manifest, kept as a record) ---

CORPUS = "corpus-debian-bookworm-2026-11-28.json"


def render_corpus(root: Path, doc: Path) -> str:
    head = ["pair", "segment pairs", "distinct", "train", "dev", "test"]
    rows = []
    for pair, built in _load(root, CORPUS)["pairs"].items():
        stats, counts = built["stats"], built["counts"]
        distinct = stats["segment_pairs"] - stats["duplicates_removed"]
        cells = [stats["segment_pairs"], distinct, counts["train"], counts["dev"], counts["test"]]
        rows.append([pair, *(f"{n:,}" for n in cells)])
    return _table(head, rows) + _sources(doc, root, [CORPUS])


# --- docs/corpus.md: the catalog corpus by pair, with what each cleaning step left out ---

CATALOGS = "corpus-catalogs-bookworm-2026-12-02.json"


def render_catalogs(root: Path, doc: Path) -> str:
    head = ["pair", "catalogs", "messages", "option tables", "inner placeholders", "edge placeholders",
            "plural", "duplicates", "pairs", "train", "dev", "test"]  # fmt: skip
    rows = []
    for pair, built in _load(root, CATALOGS)["pairs"].items():
        st, counts = built["stats"], built["counts"]
        duplicates = st["duplicates_in_catalog"] + st["duplicates_across_catalogs"]
        cells = [st["catalogs"], st["messages"], st["verbatim"], st["placeholders"],
                 st["placeholders_stripped"], st["plural"], duplicates, st["pairs"],
                 counts["train"], counts["dev"], counts["test"]]  # fmt: skip
        rows.append([pair, *(f"{n:,}" for n in cells)])
    return _table(head, rows) + _sources(doc, root, [CATALOGS])


# --- docs/scale-plan.md: maps, text and GPU hours for 100 languages, from the measured dump rates ---

PLAN_CPU = "build-cpu-2026-11-28-eight-directions.json"  # its first run: the eight added directions' dump
# the H200 dump's second runs (the rates a long dump meets): the greedy path streamed as counts, the reference
PLAN_GPU = [f"gpu-h200-2026-11-27-teacher-rows/repeat/{p}/gpu-dump.json" for p in ("streamed", "reference")]
LANGUAGES, MAP_LINES = 100, 20_000_000  # MAP_LINES: the source lines of one map, as Amer et al. build it
EN_CENTRIC, EVERY_PAIR = 2 * (LANGUAGES - 1), LANGUAGES * (LANGUAGES - 1)  # to/from English; ordered pairs


def _si(n: float) -> str:
    """490M, 4.0B, 173K: one decimal below 10, none above."""
    div, unit = next((d, u) for d, u in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")) if n >= d)
    return f"{n / div:.{int(n < 10 * div)}f}{unit}"


def _plan_tables(root: Path, doc: Path) -> list[str]:
    """docs/scale-plan.md's three tables: what was measured, the maps, the text and GPU hours."""
    rec, (g, r) = _load(root, PLAN_CPU), [_load(root, n)["results"][-1] for n in PLAN_GPU]  # second runs
    p, cores = rec["runs"][0]["params"], rec["meta"]["cpu_count"]
    dumps = [s["metrics"] for s in rec["runs"][0]["stages"] if s["name"].startswith("dump:")]
    lines, states = (sum(m[k] for m in dumps) for k in ("sentences", "states"))
    wall = dumps[0]["stage_wall_seconds"]  # the stage's, recorded on each direction
    per, rate = "states_per_sentence", "states_per_s"  # the H200 rows' keys, given to the CPU's row too
    cpu = {per: states / lines, rate: states / wall}

    def path(x: dict) -> str:  # states a line, the rate, one map's states and hours
        n, h = MAP_LINES * x[per], MAP_LINES * x[per] / x[rate] / 3600
        return f"{x[per]:.1f} | {_si(x[rate])} states/s | {_si(n)} states, {h:.{2 * (h < 10)}f} h"

    def plan(label: str, maps: int) -> str:  # source lines, greedy-path hours on the H200 and on the CPU
        n = maps * MAP_LINES * g[per]
        cost = f"{n / g[rate] / 3600:,.0f} | {n / cpu[rate] / (365.25 * 86400):.1f} years"
        return f"| {label} | {maps:,} | {_si(maps * MAP_LINES)} | {cost} |\n"

    measured = (
        f"| work | where | states a source line | rate | one map ({_si(MAP_LINES)} source lines) |\n"
        "| --- | --- | ---: | ---: | ---: |\n"
        f"| dump, greedy path and reference path, {len(dumps)} directions, at most "
        f"{int(p['dump.sentences']):,} source lines each ({lines:,.0f} in all, {states / 1e6:.2f}M states, "
        f"{wall:.0f} s) | {cores} CPU cores, {p['dump.num_workers']} Ray workers | {path(cpu)} |\n"
        f"| dump, greedy path, streamed as counts (batch {g['batch_size']:,}) | one H200 | {path(g)} |\n"
        f"| dump, reference path (teacher forcing, batch {r['batch_size']:,}) | one H200 | {path(r)} |\n"
    )
    maps = (
        f"| scope | English-centric ({EN_CENTRIC} directions) | every pair ({EVERY_PAIR:,} directions) |\n"
        "| --- | ---: | ---: |\n"
        f"| one map per direction (source and target known) | {EN_CENTRIC} | {EVERY_PAIR:,} |\n"
        f"| one map per target language (every source pooled into it) | {LANGUAGES} | {LANGUAGES} |\n"
        "| per direction where text is plenty, pooled where it is short (the demo model's choice, "
        f"`bench scope`) | {LANGUAGES}-{EN_CENTRIC} | {LANGUAGES} + the directions with their own text |\n"
    )
    hours = (
        "| plan | maps | source lines | greedy-path GPU hours (demo model, H200) | "
        f"the same on {cores} CPU cores |\n| --- | ---: | ---: | ---: | ---: |\n"
        + plan("per direction, English-centric", EN_CENTRIC)
        + plan("per target language, English-centric or every pair", LANGUAGES)
        + plan("per direction, every pair", EVERY_PAIR)
    )
    return [
        measured + "\n" + _sources(doc, root, [PLAN_CPU, *PLAN_GPU]),
        maps + f"\nRendered by `benchmarks/render_tables.py` for {LANGUAGES} languages.\n",
        hours + "\n" + _sources(doc, root, [PLAN_CPU, PLAN_GPU[0]]),
    ]


# --- README: the status, clustered int8 against CTranslate2 int8 on each CPU measured (bench_peer) ---

CLU8, VS_CT2_INT8 = "fastvocab clustered int8", "speed_vs_ct2_int8"
STATUS_POINTS = ("greedy, batch 1", "beam 4, batch 1", "greedy, batch 32", "beam 4, batch 32")
AMD_POINTS = (("b1-n200", "beam1"), ("b1-beam4-n200", "beam4"), ("b32", "beam1"), ("b32", "beam4"))
NO_AMX_POINTS = (("b1", "beam1"), ("b1", "beam4"), ("b32", "beam1"), ("b32", "beam4"))


def _points(stem: str, points: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """(record, run) of each point, the records named ``peer-cpu-<stem>-<point>.json`` (stem: date-cpu)."""
    return tuple((f"peer-cpu-{stem}-{n}.json", run) for n, run in points)


# Per CPU, the newest record of each point: the ONNX Runtime engine, kept workers (bench_peer --engine onnx).
STATUS_CPUS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Xeon (AVX-512 VNNI, AMX)", tuple((name, run) for _, name, run in PEER)),
    # the same VM with AMX refused and the ISA caps of an AMD EPYC Zen 4 (bench_meta.emulate)
    ("Xeon emulating an AVX-512 CPU without AMX", _points("2026-12-04-xeon-emulating-no-amx", NO_AMX_POINTS)),
    # no AVX-VNNI: an AMD EPYC with AVX-512 and without it is a Zen 4
    ("AMD EPYC Zen 4 (AVX-512 VNNI, no AMX)", _points("2026-12-02-epyc-avx512", AMD_POINTS)),
    ("AMD EPYC Zen 5 (AVX-512 VNNI, AVX-VNNI, no AMX)", _points("2026-12-02-epyc-zen5", AMD_POINTS)),
    # no AVX-512: an AMD EPYC of family 25 model 1 is a Zen 3 (Milan)
    ("AMD EPYC Zen 3 (AVX2, no VNNI, no AMX)", _points("2026-12-02-epyc-zen3", AMD_POINTS)),
)


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"


def render_status(root: Path, doc: Path) -> str:
    """The README's status: three sentences, and clustered int8 against CTranslate2 int8 by CPU."""
    clu = [_load(root, name)["runs"][run]["systems"]["fastvocab clustered fp32"] for _, name, run in PEER]
    speed = _span([s["speed_vs_full"] for s in clu], ".2f")
    changed = _span([100 * s["lines_changed_vs_fastvocab_full_fp32"] for s in clu], ".1f")
    ratios = {cpu: [_peer(run)(_load(root, name)) for name, run in points] for cpu, points in STATUS_CPUS}
    full_fp32 = functools.partial(_peer, system="fastvocab full fp32", key="speed_vs_ct2_float32")
    # the batch-32 points
    full = {
        cpu: [full_fp32(run)(_load(root, name)) for name, run in points[2:]] for cpu, points in STATUS_CPUS
    }
    named = [p.replace(", ", " ") for p in STATUS_POINTS]
    # ratios within 5% are ties on these shared VMs (the README's Results say so)
    behind, level = [], []
    for cpu, rs in ratios.items():
        for point, r in zip(named, rs, strict=True):
            if r < 1.05:
                (behind if r < 0.95 else level).append(f"{point} on the {cpu.split(' (')[0]} ({r:.2f}x)")
    ahead = [p for i, p in enumerate(named) if all(rs[i] >= 1.05 for rs in ratios.values())]
    every = [r for rs in ratios.values() for r in rs]
    if len(ahead) == len(named):
        lead = f"ahead at every point on every CPU ({_span(every, '.2f')}x)"
    else:
        listed = " and ".join([", ".join(ahead[:-1]), ahead[-1]] if len(ahead) > 1 else ahead)
        lead = f"ahead at {listed} on every CPU" if ahead else "ahead at no point on every CPU"
    lead += f"; level at {', '.join(level)}" if level else ""
    lead += f"; behind at {', '.join(behind)}" if behind else ""
    fp32 = _span([r for rs in full.values() for r in rs], ".2f")
    text = (
        "**Status.** On CPU, clustered decoding with the maps and shortlist shipped with the demo model ran "
        f"{speed}x as fast as full softmax with the same model, engine and threads, and changed {changed}% "
        "of the outputs (en-it, float32, the [results table](#results)). Against CTranslate2 (below: its "
        f"time over fastvocab's), full float32 ran {fp32}x as fast as its float32 at batch 32, and clustered "
        f"int8's lead over its int8 depends on the CPU and the batch: {lead}. On a "
        "GPU the clustered projection does not yet beat cuBLAS's full projection: use full softmax there "
        "([docs/gpu.md](docs/gpu.md))."
    )
    text = textwrap.fill(text, 110, break_long_words=False, break_on_hyphens=False) + "\n\n"
    head = ["clustered int8 vs CTranslate2 int8, en-it, 2 workers", *STATUS_POINTS,
            "full fp32 vs CTranslate2 float32, batch 32, greedy / beam 4"]  # fmt: skip
    rows = []
    for cpu, points in STATUS_CPUS:
        dates = sorted({_load(root, name)["date"][:10] for name, _ in points})
        rows.append([f"{cpu}, {' and '.join(dates)}", *(f"{r:.2f}x" for r in ratios[cpu]),
                     " / ".join(f"{r:.2f}x" for r in full[cpu])])  # fmt: skip
    names = [name for _, points in STATUS_CPUS for name, _ in points]
    return text + _table(head, rows) + _sources(doc, root, list(dict.fromkeys(names)))


# --- docs/model-scale.md: M2M100-418M's shape against CTranslate2, by CPU (bench_model_scale) ---

# label, record; a row's ratios are CTranslate2's median time over fastvocab's, in the same run
SCALE_XEON = (
    ("batch 32, 10% sets; int8 GEMMs of 16+ rows on ONNX Runtime (0019)",
     "model-scale-cpu-2026-11-29-xeon-418m-greedy-b32-onnx-int8-gemm-ort.json"),
    ("the same run on fbgemm (`FASTVOCAB_INT8_GEMM=fbgemm`)",
     "model-scale-cpu-2026-11-29-xeon-418m-greedy-b32-onnx-int8-gemm-fbgemm.json"),
    ("batch 32, 10% sets; the gather multiplies in int8 (0023)",
     "model-scale-cpu-2026-11-29-xeon-418m-greedy-b32-onnx-int-mm.json"),
    ("batch 1, 2% / 5% sets; the gather's rows widened to float32 (before 0023)",
     "model-scale-cpu-2026-11-29-xeon-418m-b1-onnx-float-widening-r5.json"),
    ("batch 1, 2% / 5% sets; the gather multiplies in int8 (0023)",
     "model-scale-cpu-2026-11-29-xeon-418m-b1-onnx-int-mm.json"),
    ("batch 1, 2% / 5% sets; fbgemm called from TorchScript (0024)",
     "model-scale-cpu-2026-11-29-xeon-418m-b1-onnx-torchscript.json"),
    ("batch 1, 2% / 5% sets; the compiled beam step (0025)",
     "model-scale-cpu-2026-11-29-xeon-418m-b1-beam4-compiled-step.json"),
    ("batch 1, 2% / 5% sets; candidates compiled at every width (0026)",
     "model-scale-cpu-2026-11-29-xeon-418m-b1-beam4-wide-candidates.json"),
    ("batch 32, 2% / 10% sets; steps skip the map where the map probe measured it slower (2026-12-04)",
     "model-scale-cpu-2026-12-04-xeon-418m-greedy-b32-onnx.json"),
)  # fmt: skip
SCALE_NO_AMX = (
    ("AMD EPYC Zen 5 (AVX-512 VNNI, AVX-VNNI), batch 32, 2% / 10% sets",
     "model-scale-cpu-2026-12-02-epyc-zen5-418m-greedy-b32-onnx.json"),
    ("Xeon emulating an AVX-512 CPU without AMX, batch 32, 2% / 10% sets",
     "model-scale-cpu-2026-12-02-xeon-emulating-no-amx-418m-greedy-b32-onnx.json"),
    ("AMD EPYC Zen 3 (AVX2, no VNNI), batch 32, 2% / 10% sets",
     "model-scale-cpu-2026-12-02-epyc-zen3-418m-greedy-b32-onnx.json"),
)  # fmt: skip


def _scale_rows(root: Path, name: str, label: str) -> str:
    rows = _load(root, name)["rows"]
    out = ""
    for beam in sorted({r["beam"] for r in rows}):
        at = [r for r in rows if r["beam"] == beam]

        def vs(r: dict, at: list[dict] = at) -> str:
            ct2 = next(c for c in at if c["system"] == f"ct2 {'int8' if r['dtype'] == 'int8' else 'float32'}")
            return f"{ct2['seconds_median'] / r['seconds_median']:.2f}x"

        def cells(prefix: str, fmt: Callable[[dict], str] = vs, at: list[dict] = at) -> str:
            hit = sorted(
                (r for r in at if r["system"].startswith(prefix)), key=lambda r: r["active_fraction"] or 0
            )
            return " / ".join(fmt(r) for r in hit) or "-"

        share = cells("fastvocab clustered int8", lambda r: f"{r['projection_share']:.2f}")
        search = "greedy" if beam == 1 else f"beam {beam}"
        out += _row([label, search, cells("fastvocab full fp32"), cells("fastvocab full int8"),
                     cells("fastvocab clustered int8"), share])  # fmt: skip
    return out


def _render_scale(spec: tuple[tuple[str, str], ...]) -> Callable[[Path, Path], str]:
    def render(root: Path, doc: Path) -> str:
        head = ["M2M100-418M shape, 2 workers", "search", "full fp32 vs CT2 float32", "full int8 vs CT2 int8",
                "clustered int8 vs CT2 int8", "clustered int8: `s`"]  # fmt: skip
        out = _row(head) + _row(["---", "---"] + ["---:"] * (len(head) - 2))
        out += "".join(_scale_rows(root, name, label) for label, name in spec)
        return out + "\n" + _sources(doc, root, [name for _, name in spec])

    return render


# --- docs/cpu-engine.md: what each change to the CPU engine gained, from its before and after records ---

Getter = Callable[[dict], float]


def _peer(run: str, system: str = CLU8, key: str = VS_CT2_INT8) -> Getter:
    return lambda rec: rec["runs"][run]["systems"][system][key]


def _entry(table: str, key: str, **sel: object) -> Getter:
    """One entry of a record's list ``table`` (``translate``, ``calls``, ``rows``) picked by ``sel``."""
    return lambda rec: _match(rec[table], **sel)[key]


def _kmeans(direction: str) -> Getter:
    stage = f"kmeans:{direction}"
    return lambda rec: _match(rec["runs"][0]["stages"], name=stage)["metrics"]["kmeans_seconds"]


# A measure: what it is, its unit ("s", "ms", "us", "share" or "vs CT2": a ratio where more is faster), and
# (record, getter) before and after. A step's whole-run gain is before / after for times, after / before for
# ratios against CTranslate2.
Ref = tuple[str, Getter]
Measure = tuple[str, str, Ref, Ref]
CLU_INT8 = {"engine": "onnx", "dtype": "int8", "method": "clustered"}
FULL_FP32 = {"engine": "onnx", "dtype": "float32", "method": "full"}
WHOLE = "whole run"


def _bd(stem: str, field: str, **sel: object) -> Ref:
    """A run-breakdown record (``run-breakdown-cpu-<stem>.json``): one part (or ``total``) of one row."""
    return f"run-breakdown-cpu-{stem}.json", _entry("rows", field, **sel)


def _parts(before: str, after: str, field: str, point: str, **sel: object) -> tuple[Measure, Measure]:
    """A part of a one-thread run at ``point`` and the whole run, before and after, from two run-breakdown
    records (a breakdown's ``rest``: all but its named parts, the search among them)."""
    what = f"one thread, {point}: {'search and rest' if field == 'rest' else field}"
    part = (what, "s", _bd(before, field, **sel), _bd(after, field, **sel))
    return part, (WHOLE, "s", _bd(before, "total", **sel), _bd(after, "total", **sel))


def _scale(stem: str, key: str, **sel: object) -> Ref:
    """A bench_model_scale record (``model-scale-cpu-2026-11-29-xeon-418m-<stem>.json``), one row's field."""
    return f"model-scale-cpu-2026-11-29-xeon-418m-{stem}.json", _entry("rows", key, **sel)


def _vs_ct2(what: str, before: str, after: str, run: str) -> Measure:
    return what, "vs CT2", *_both(before, after, _peer(run))


def _both(before: str, after: str, getter: Getter) -> tuple[Ref, Ref]:
    """The same field of two records, before and after."""
    return (before, getter), (after, getter)


def _fields(name: str, table: str, before: str, after: str, **sel: object) -> tuple[Ref, Ref]:
    """Two fields of one entry of one record: the way before and the way after, measured alike."""
    return (name, _entry(table, before, **sel)), (name, _entry(table, after, **sel))


B1_CLU, B4_CLU, XEON = "greedy, batch 1, clustered int8", "beam 4, batch 1, clustered int8", "2026-11-28-xeon"
ALTERNATING = "one thread, the two ways alternating"
CLU10 = "fastvocab clustered int8 10%"
KMEANS = tuple(f"kmeans-cpu-2026-11-29-xeon-{k}-kernels.json" for k in ("prescott", "skylakex"))
CALLS = "int8-calls-cpu-2026-11-29-xeon.json"
FIRST_LINE = tuple(
    f"first-line-cpu-2026-12-04-xeon-clustered-int8{k}.json" for k in ("-sessions-at-load", "")
)
CPU_STEPS: tuple[tuple[str, str, Measure | None, Measure], ...] = (
    ("0010", "batches and encoder attention by length; int8 cluster scores; threads from 32 rows", None,
     _vs_ct2("bench_peer, greedy, batch 32, clustered int8", "peer-cpu-2026-11-28-engine-b32-quiet.json",
             "peer-cpu-2026-11-28-lengths-b32.json", "beam1")),
    ("0011", "binding by address, cached blocks with a shortlist, forks that run the parent's session",
     *_parts("2026-11-28-b1-before", "2026-11-28-b1-after", "projection", B1_CLU, beam=1, **CLU_INT8)),
    ("0012", "the caller decodes beside its forks; a one-row greedy loop; a leaner one-row step",
     *_parts("2026-11-28-b1-after", "2026-11-28-b1-one-row", "projection", B1_CLU, beam=1, **CLU_INT8)),
    ("0013", "the encoder's layers in ONNX Runtime",
     *_parts("2026-11-28-b1-before-onnx-encoder", "2026-11-28-b1-onnx-encoder", "encoder and start", B1_CLU,
             beam=1, **CLU_INT8)),
    ("0014", "workers kept from call to call (`DecodePool`)", None,
     _vs_ct2("bench_peer, greedy, batch 1, 48 lines, clustered int8",
             "peer-cpu-2026-11-28-fresh-workers-b1.json",
             "peer-cpu-2026-11-28-kept-workers-b1.json", "beam1")),
    ("0015", "a beam's rows keep their cache rows",
     *_parts("2026-11-28-b32-beam4-before-follow", "2026-11-28-b32-beam4-follow", "reorders",
             "beam 4, batch 32, clustered int8", beam=4, **CLU_INT8)),
    ("0016", "fewer tensor ops in a one-sentence beam step",
     *_parts(f"{XEON}-b1-beam4-before-ops", f"{XEON}-b1-beam4-after-ops", "projection", B4_CLU, **CLU_INT8)),
    ("0017", "a step's small work in numpy on the host",
     *_parts(f"{XEON}-b1-beam4-before-host-2", f"{XEON}-b1-beam4-after-host-2", "projection", B4_CLU,
             **CLU_INT8)),
    ("0018", "the beam step's bookkeeping and reorder in numpy", None,
     _vs_ct2(f"bench_peer, {B4_CLU}", f"peer-cpu-{XEON}-host-step-b1-beam4-n200.json",
             f"peer-cpu-{XEON}-host-beam-b1-beam4-n200-timed.json", "beam4")),
    ("0019", "int8 GEMMs of 16+ rows on ONNX Runtime where the CPU has AMX",
     ("M2M100-418M shape, greedy, batch 32, clustered int8: projection share", "share",
      _scale("greedy-b32-onnx-int8-gemm-fbgemm", "projection_share", system=CLU10),
      _scale("greedy-b32-onnx-int8-gemm-ort", "projection_share", system=CLU10)),
     (WHOLE, "s", _scale("greedy-b32-onnx-int8-gemm-fbgemm", "seconds_median", system=CLU10),
      _scale("greedy-b32-onnx-int8-gemm-ort", "seconds_median", system=CLU10))),
    ("0020", "a search writes its scores in the logits' memory",
     *_parts("2026-11-29-xeon-b32-full-before-scores-in-place", "2026-11-29-xeon-b32-full-scores-in-place",
             "rest", "beam 4, batch 32, full float32", beam=4, **FULL_FP32)),
    ("0021", "`--engine auto` runs the ONNX Runtime engine on CPU", None,
     (f"bench_peer, {B1_CLU}: the static engine, then ONNX Runtime's, same rounds", "s",
      ("engines-cpu-2026-11-29-xeon-b1.json",
       _peer("beam1", "fastvocab-static clustered int8", "seconds_median")),
      ("engines-cpu-2026-11-29-xeon-b1.json", _peer("beam1", CLU8, "seconds_median")))),
    ("0022", "Faiss' OpenBLAS told this CPU's kernels",
     ("`configs/demo.yaml`'s k-means, en-it", "s", *_both(*KMEANS, _kmeans("en-it"))),
     ("the stage, three directions", "s", *_both(*KMEANS, lambda rec: rec["seconds_total"]))),
    ("0023", "the int8 gather multiplies in int8",
     ("bench_int8_gather, d 1024, 1 row, 5% of N", "ms",
      *_both(*(f"int8-gather-cpu-2026-11-29-xeon-{k}.json" for k in ("float-widening", "int-mm")),
             _entry("rows", "ms", kernel="int8-gather", rows=1, union=0.05))),
     ("M2M100-418M shape, greedy, batch 1, clustered int8, 5% sets", "s",
      _scale("b1-onnx-float-widening-r5", "seconds_median", system="fastvocab clustered int8 5%", beam=1),
      _scale("b1-onnx-int-mm", "seconds_median", system="fastvocab clustered int8 5%", beam=1))),
    ("0024", "fbgemm's int8 GEMM called from TorchScript",
     ("a call, d 256, 300 columns, 1 row", "us",
      *_fields(CALLS, "calls", "one_python_us", "one_torchscript_us", d=256, columns=300, rows=1)),
     (f"{ALTERNATING}, {B4_CLU}", "s",
      *_fields(CALLS, "translate", "python_median_s", "torchscript_median_s", engine="onnx", beam=4,
               batch=1))),
    ("0025", "a beam step's candidates, advance and `moments` estimate compiled (numba)", None,
     (f"{ALTERNATING}, {B4_CLU}", "s",
      *_fields("host-step-cpu-2026-11-29-xeon.json", "translate", "numpy_median_s", "compiled_median_s",
               projection="clustered int8", batch=1))),
    ("0026", "a beam step's candidates compiled at every width", None,
     (f"{ALTERNATING}, beam 4, batch 32, full float32", "s",
      *_fields("host-step-cpu-2026-11-29-xeon-wide-candidates.json", "translate", "torch-candidates_median_s",
               "compiled_median_s", projection="full float32"))),
    ("0028", "steps of many rows skip the map where the map probe measured it slower", None,
     _vs_ct2("bench_peer, greedy, batch 32, clustered int8",
             "peer-cpu-2026-12-04-xeon-b32-before-map-probe.json",
             "peer-cpu-2026-12-04-xeon-b32-map-probe-en-it-k1.json", "beam1")),
    ("0029", "int8 ONNX Runtime sessions opened at their first use",
     ("bench_first_line, a one-line clustered int8 translate: set-up", "s",
      *_both(*FIRST_LINE, lambda rec: rec["median"]["load_s"])),
     (WHOLE, "s", *_both(*FIRST_LINE, lambda rec: rec["median"]["wall_s"]))),
)  # fmt: skip
DECISIONS = "docs/decisions"


def _device(rec: dict) -> str:
    device = rec.get("device") or rec["meta"]["device"]
    return "Xeon (AMX)" if "Xeon" in device else "AMD EPYC" if "EPYC" in device else device.split(" (")[0]


def _value(x: float, unit: str) -> str:
    return f"{x:.2f}x" if unit == "vs CT2" else f"{x:.2f}" if unit == "share" else f"{x:.3g} {unit}"


def _step_link(root: Path, doc: Path, number: str) -> str:
    """A change's decision record where one stands, else its section in ``doc`` (GitHub's heading anchor)."""
    if kept := sorted((root / DECISIONS).glob(f"{number}-*.md")):
        return Path(os.path.relpath(kept[0], doc.parent)).as_posix()
    heading = re.search(rf"^### ({number}\b.*)$", doc.read_text(), re.M)
    if heading is None:
        raise SystemExit(
            f"{doc.relative_to(root)}: no section '### {number}...' and no decision record {number}"
        )
    return "#" + re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")


def render_cpu_steps(root: Path, doc: Path) -> str:
    head = ["step", "change", "CPU", "measured", "before", "after", "whole run: before", "after", "gain"]
    out = _row(head) + _row(["---"] * 4 + ["---:"] * 5)
    names: list[str] = []
    for number, change, part, whole in CPU_STEPS:
        cells = [f"[{number}]({_step_link(root, doc, number)})", change]
        measured: list[str] = []
        values: list[str] = []
        for measure in (part, whole):
            if measure is None:
                values += ["", ""]
                continue
            what, unit, before, after = measure
            b, a = (getter(_load(root, name)) for name, getter in (before, after))
            names += [before[0], after[0]]
            measured.append(what if unit != "vs CT2" else f"{what} vs CTranslate2 int8")
            values += [_value(b, unit), _value(a, unit)]
        gain = a / b if whole[1] == "vs CT2" else b / a  # the whole run's: the last measure
        cells += [_device(_load(root, whole[3][0])), "; ".join(measured), *values, f"{gain:.2f}x"]
        out += _row(cells)
    return out + "\n" + _sources(doc, root, list(dict.fromkeys(names)))


HOT = "run-breakdown-cpu-2026-11-29-xeon-b1-hot.json"
HOT_CALLS = (
    ("the body's run (ONNX Runtime)", "body run"),
    ("centroid assignment (2,000 x 256 int8, 512 KB)", "assignment"),
    ("cached blocks and the batch's columns", "cached blocks"),
    ("inactive mass (`moments`, W's 256 KB Gram matrix)", "inactive mass"),
)


def render_cpu_hot(root: Path, doc: Path) -> str:
    """A step's main calls as a run pays them and repeated at once (bench_step_profile --hot), us a call."""
    rows = {r["beam"]: r["calls"] for r in _load(root, HOT)["rows"]}
    head = ["call", "beam 4: in the run", "repeated", "greedy: in the run", "repeated"]

    def us(call: dict | None) -> list[str]:
        return [f"{call['in_run_us']:.0f}", f"{call['repeat_us']:.0f}"] if call else ["-", "-"]

    lines = [[label, *us(rows[4].get(key)), *us(rows[1].get(key))] for label, key in HOT_CALLS]
    return _table(head, lines) + _sources(doc, root, [HOT])


TABLES: dict[str, Callable[[Path, Path], str]] = {
    "peer-cpu": render_peer, "methods-cpu": render_methods, "demo-model-bleu": render_demo_bleu,
    "shipped-maps": render_shipped, "data-scale": render_data_scale, "coverage": render_coverage,
    "shipped-test": render_shipped_test, "scale": render_scale, "maps-card": render_card,
    "corpus": render_corpus, "catalogs": render_catalogs,
    "scale-plan-measured": lambda root, doc: _plan_tables(root, doc)[0],
    "scale-plan-maps": lambda root, doc: _plan_tables(root, doc)[1],
    "scale-plan-hours": lambda root, doc: _plan_tables(root, doc)[2],
    "status": render_status, "model-scale-xeon": _render_scale(SCALE_XEON),
    "model-scale-no-amx": _render_scale(SCALE_NO_AMX), "cpu-steps": render_cpu_steps,
    "cpu-hot": render_cpu_hot,
}  # fmt: skip


def docs(root: Path) -> list[Path]:
    found: list[Path] = []
    for place in DOC_PLACES:
        path = root / place
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path] if path.is_file() else []
    return found


def render_doc(root: Path, doc: Path) -> str:
    """The doc's text with every marked table rendered afresh."""

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in TABLES:
            raise SystemExit(f"{doc.relative_to(root)}: unknown table {name!r} (known: {', '.join(TABLES)})")
        return f"<!-- table:{name} -->\n{TABLES[name](root, doc)}<!-- /table:{name} -->"

    return MARKER.sub(sub, doc.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the tables in place")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each doc whose tables differ")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    differing = []
    for doc in docs(root):
        text = doc.read_text()
        if "<!-- table:" not in text or (rendered := render_doc(root, doc)) == text:
            continue
        if args.write:
            doc.write_text(rendered)
            print(f"rewrote {doc.relative_to(root)}")
        else:
            differing.append(str(doc.relative_to(root)))
    for name in differing:
        print(f"{name}: a table differs from its records (python benchmarks/render_tables.py --write)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())

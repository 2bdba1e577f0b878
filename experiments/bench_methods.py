"""Every output-layer method side by side: ``fastvocab bench methods``.

For each direction (the test split of a corpus) and beam size, decode the same sentences with ``full`` and
with every point of a parameter grid of ``clustered`` (union selection), ``per-row`` (clustered, per-row
selection), ``lsh``, ``graph`` and ``shortlist``, in one process, and record per point against full softmax
with the same search and settings, with the fidelity yardstick's own pieces (``experiments/fidelity.py``:
``decode_all`` interleaves every projection batch by batch, ``Scorer`` scores outputs under the full model):

- ``identical``, ``search_errors`` (Hoang et al.), ``better``: as in ``experiments/fidelity.py``;
- ``bleu``/``chrf`` (and ``*_full``): sacrebleu against the references;
- ``candidates_per_row``: vocabulary columns computed per decoder row, counted from what each call returns
  (full: N; shortlist with sentence scope: the batch's union, of which a row may pick only its own
  sentence's); ``certified`` (clustered with ``exact``): the share of rows with an exactness certificate;
- ``sent_per_s``, ``tok_per_s`` (and ``*_full``), ``speed_ratio`` (full seconds / method seconds, wall
  time), ``cpu_ratio`` (process CPU time, steadier on a shared machine): decoding only, median over repeats;
- ``projection_seconds`` (and ``_full``, ``projection_ratio`` full / method): time spent inside the output
  layer while decoding (perf_counter around every call; on CUDA with a synchronize after each call), summed
  over the decode, median over repeats; this includes a method's selection work (hashing, graph search,
  gathering W rows), not only the matrix product;
- ``rss_peak_mib`` / ``rss_delta_mib``: peak resident set size of the process (``VmHWM`` of
  /proc/self/status, reset through /proc/self/clear_refs before each method) while that method alone decodes
  the warm-up sentences, and that peak minus the RSS before it; where the reset is not allowed, the process's
  ``ru_maxrss`` (a lifetime peak, the same for every later method): ``memory_method`` says which;
- ``build_seconds``, ``artifact_bytes``: the method's offline artifact (lsh codes, graph index, shortlist
  table: built here, timed, saved to a scratch folder and measured on disk, or read from ``methods_dir``
  with the build time its manifest recorded; cluster map: its files' size, build time not recorded (dump,
  k-means and maps stages));
- ``started``, ``ended``: when the point's work ran (seconds since the epoch), from its warm-up to the end
  of the passes it shares with the other points of its beam and their scoring: the span of its MLflow run.

Plain functions: no Ray, no MLflow; the callers print, write and log.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fastvocab.artifacts_schema.cluster_map import load_cluster_map, resolve_map_dir
from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.method_index import (
    ANY_DIRECTION,
    MANIFEST_FILE,
    MethodIndex,
    load_method_index,
)
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.settings import SearchSettings
from fastvocab.experiments.fidelity import Reference, Scorer, decode_all, decode_passes
from fastvocab.kernels.base import Projection, ProjectionOutput
from fastvocab.tasks.methods import INDEXED_METHODS
from fastvocab.tasks.projections import make_projection

METHODS = ("full", "clustered", "per-row", "lsh", "graph", "shortlist")
CLUSTERED = ("clustered", "per-row")  # both read the cluster map

# Per grid: method -> points (projection options on top of the artifact); artifact parameters per method.
GRIDS: dict[str, dict[str, list[dict[str, Any]]]] = {
    "quick": {
        "full": [{}],
        "clustered": [{}],
        "per-row": [{}],
        "lsh": [{"k": 500}, {"k": 2000}],
        "graph": [{"k": 50, "ef_search": 64}, {"k": 200, "ef_search": 256}],
        "shortlist": [{"k": 20, "frequent": 100}, {"k": 100, "frequent": 500}],
    },
    "full": {
        "full": [{}],
        "clustered": [{}, {"exact": True}],
        "per-row": [{}],
        "lsh": [{"k": k} for k in (250, 500, 1000, 2000, 4000, 8000)],
        "graph": [
            {"k": 10, "ef_search": 64},
            {"k": 50, "ef_search": 128},
            {"k": 100, "ef_search": 256},
            {"k": 200, "ef_search": 512},
            {"k": 500, "ef_search": 1000},
        ],
        "shortlist": [
            {"k": k, "frequent": f} for k, f in ((10, 100), (20, 200), (50, 500), (100, 1000), (200, 2000))
        ],
    },
}
SENTENCES = {"quick": 30, "full": 100}


def parse_point(text: str) -> tuple[str, dict[str, Any]]:
    """``"shortlist:k=50,frequent=2000"`` -> ``("shortlist", {"k": 50, "frequent": 2000})``: one grid point
    of one method, as ``--point`` gives it (values: integers, floats, true/false, else strings); a method
    with no options is ``"clustered"`` or ``"clustered:"``. ValueError for an unknown method or a bad pair."""
    method, _, rest = text.strip().partition(":")
    if method not in METHODS:
        raise ValueError(f"--point {text!r}: unknown method {method!r}; valid: {', '.join(METHODS)}")
    point: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"--point {text!r}: {pair!r} is not KEY=VALUE")
        point[key.strip()] = _point_value(value.strip())
    return method, point


def _point_value(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def artifact_params(grid: str) -> dict[str, Any]:
    """The artifact each indexed method's points share, per grid (the points' k and frequent stay within)."""
    from fastvocab.kernels.graph import GraphParams
    from fastvocab.kernels.lsh import LshParams
    from fastvocab.tasks.shortlist import ShortlistParams

    quick = grid == "quick"
    return {
        "lsh": LshParams(bits=256),
        "graph": GraphParams(m=16, ef_construction=100) if quick else GraphParams(),
        "shortlist": ShortlistParams(k=100, frequent=500, max_sentences=20000)
        if quick
        else ShortlistParams(k=200, frequent=2000),
    }


@dataclass(frozen=True)
class BenchSettings:
    """What one ``bench methods`` run measures."""

    grid: str = "quick"
    methods: tuple[str, ...] = METHODS
    beams: tuple[int, ...] = (1, 4)
    batch_size: int = SearchSettings.batch_size
    sentences: int | None = None  # first N of the split; None: the grid's default; 0: all
    split: str = "test"
    max_len: int = SearchSettings.max_len
    length_penalty: float = SearchSettings.length_penalty
    repeats: int = 1
    warmup: int = 8  # sentences each method decodes alone first (warm-up, and the memory measurement)
    points: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # overrides GRIDS[grid]
    artifacts: dict[str, Any] = field(default_factory=dict)  # overrides artifact_params(grid)

    def __post_init__(self) -> None:
        if self.grid not in GRIDS:
            raise ValueError(f"unknown grid {self.grid!r}; valid: {', '.join(GRIDS)}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
        unmeasured = [m for m in self.points if m not in self.methods]
        if unmeasured:
            raise ValueError(f"points given for {unmeasured}, which are not among the methods measured")
        if not self.beams or min(self.beams) < 1 or self.batch_size < 1:
            raise ValueError(f"beam and batch sizes must be >= 1, got {self.beams} and {self.batch_size}")
        if self.repeats < 1 or self.max_len < 1 or (self.sentences or 0) < 0 or self.warmup < 1:
            raise ValueError(f"repeats, max_len and warmup must be >= 1, sentences >= 0: {self}")

    @property
    def n_sentences(self) -> int:
        return SENTENCES[self.grid] if self.sentences is None else self.sentences

    def grid_points(self, method: str) -> list[dict[str, Any]]:
        return self.points.get(method, GRIDS[self.grid][method])

    def artifact(self, method: str) -> Any:
        return self.artifacts.get(method) or artifact_params(self.grid)[method]

    def describe(self) -> dict[str, Any]:
        """JSON-able summary for the record's meta."""
        return {
            "grid": self.grid,
            "methods": list(self.methods),
            "beams": list(self.beams),
            "batch_size": self.batch_size,
            "sentences": self.n_sentences,
            "split": self.split,
            "max_len": self.max_len,
            "length_penalty": self.length_penalty,
            "repeats": self.repeats,
            "warmup_sentences": self.warmup,
            "points": {m: self.grid_points(m) for m in self.methods},
            "artifact_params": {
                m: dataclasses.asdict(self.artifact(m)) for m in self.methods if m in INDEXED_METHODS
            },
        }


# ------------------------------------------------------------------------------------------------ metering


class Metered:
    """A projection that counts what it computes and times its calls (the search sees the projection's
    interface: ``__call__`` and, for a shortlist, ``for_batch``)."""

    def __init__(self, projection: Projection, sync: bool = False) -> None:
        self.projection = projection
        self.sync = sync
        self.reset_counters()
        bind = getattr(projection, "for_batch", None)  # a shortlist's: candidates from the sources
        if bind is not None:
            self.for_batch = functools.partial(self._for_batch, bind)

    def reset_counters(self) -> None:
        """Zero the meters (``decode_passes`` calls it before each pass)."""
        self.rows = 0
        self.columns = 0
        self.calls = 0
        self.seconds = 0.0

    def options(self) -> dict[str, Any]:
        return self.projection.options()

    def _timed(self, fn: Callable[..., ProjectionOutput], *args: Any) -> ProjectionOutput:
        t0 = time.perf_counter()
        out = fn(*args)
        if self.sync:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t0
        rows, cols = out.logits.shape
        self.rows += rows
        self.columns += rows * cols
        self.calls += 1
        return out

    def __call__(self, h: torch.Tensor) -> ProjectionOutput:
        return self._timed(self.projection, h)

    def _for_batch(
        self, bind: Callable[..., Any], input_ids: Any, attention_mask: Any = None
    ) -> Callable[..., ProjectionOutput]:
        t0 = time.perf_counter()
        bound = bind(input_ids, attention_mask)
        self.seconds += time.perf_counter() - t0  # the batch's candidate sets and W gather count too
        return lambda h, row_ids: self._timed(bound, h, row_ids)

    @property
    def per_row(self) -> float | None:
        return self.columns / self.rows if self.rows else None


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux: ``5`` to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def measure_peak(fn: Callable[[], object]) -> dict[str, Any]:
    """Run ``fn`` and return the process's peak RSS during it (MiB), its delta over the RSS before it, and
    how it was measured."""
    if reset_peak_rss():
        before = _status_kib("VmRSS") or 0
        fn()
        peak = _status_kib("VmHWM") or 0
        return {
            "rss_peak_mib": round(peak / 1024, 1),
            "rss_delta_mib": round((peak - before) / 1024, 1),
            "memory_method": "VmHWM (reset via /proc/self/clear_refs)",
        }
    fn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"rss_peak_mib": round(peak / 1024, 1), "rss_delta_mib": None, "memory_method": "ru_maxrss"}


# ------------------------------------------------------------------------------------------------ artifacts


@dataclass
class Artifact:
    """An offline artifact a method's points share."""

    method: str
    index: Any  # MethodIndex, or the cluster map folder for clustered methods, or None
    build_seconds: float | None
    nbytes: int | None
    source: str  # "built" or the folder it was read from
    params: dict[str, Any] = field(default_factory=dict)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


def get_artifact(
    adapter: Seq2SeqAdapter,
    method: str,
    direction: str,
    params: Any,
    corpus: str | Path,
    methods_dir: str | Path | None,
) -> Artifact:
    """``method``'s artifact for ``direction``: read from ``methods_dir`` (``tasks.methods.index_dir``)
    when it holds one for this model, else built now (timed, saved to a scratch folder to measure it)."""
    from fastvocab.tasks.methods import MODEL_WIDE, BuildInputs, build_method_index, index_dir

    unit = ANY_DIRECTION if method in MODEL_WIDE else direction
    if methods_dir is not None:
        folder = index_dir(methods_dir, method, unit)
        if (folder / MANIFEST_FILE).exists():
            idx = load_method_index(
                folder, method, expect_fingerprint=adapter.fingerprint, direction=direction
            )
            return Artifact(
                method,
                idx,
                idx.manifest.build_seconds,
                _folder_bytes(folder),
                str(folder),
                dict(idx.manifest.params),
            )
    inputs = BuildInputs.from_adapter(adapter, unit, corpus)
    with tempfile.TemporaryDirectory(prefix=f"fastvocab-bench-{method}-") as tmp:
        t0 = time.perf_counter()
        built: MethodIndex = build_method_index(method, inputs, params, Path(tmp) / "index")
        seconds = time.perf_counter() - t0
        nbytes = _folder_bytes(Path(tmp) / "index")
    return Artifact(method, built, round(seconds, 3), nbytes, "built", dataclasses.asdict(params))


def point_options(
    method: str, point: dict[str, Any], beam: int, artifact: Artifact | None, direction: str
) -> dict:
    """Projection options of one grid point (``artifact``: its map or index; None only for full)."""
    if method == "full":
        return {}
    if artifact is None:
        raise ValueError(f"{method} needs its artifact (a cluster map or a method index)")
    if method in CLUSTERED:
        from fastvocab.tasks.projections import clustered_options

        selection = "per-row" if method == "per-row" else "union"
        rest = {k: v for k, v in point.items() if k not in ("inactive_mass", "exact", "maps")}
        opts = clustered_options(
            selection,
            point.get("inactive_mass", "auto"),
            bool(point.get("exact", False)),
            beam,
            shortlist="shortlist" in point,
        )
        cmap = artifact.index
        if "maps" in point:  # another maps root than --maps, e.g. maps of another K
            src, _, tgt = direction.partition("-")
            cmap = resolve_map_dir(point["maps"], src, tgt)
        if "shortlist" in rest:
            rest["shortlist"] = shortlist_folder(rest["shortlist"], direction)
        return {"cluster_map": cmap, **opts, **rest}  # the projection refuses an unknown option
    opts = {"index": artifact.index, **point}
    if method == "graph":  # Faiss's search threads = torch's, so no method gets more cores than another
        opts.setdefault("threads", torch.get_num_threads())
    if method == "shortlist":
        opts["direction"] = direction
    return opts


def shortlist_folder(path: str | Path, direction: str) -> Path:
    """A shortlist table's folder, looked for where ``fastvocab translate --with-shortlist`` looks
    (``tasks.methods.index_places``); else the methods stage's layout under ``path``, whose load then says
    what is missing."""
    from fastvocab.tasks.methods import index_dir, index_places

    places = index_places(path, "shortlist", direction)
    return next((p for p in places if (p / MANIFEST_FILE).exists()), index_dir(path, "shortlist", direction))


def fit_point(method: str, point: dict[str, Any], artifact: Artifact | None) -> dict[str, Any]:
    """A shortlist point within its table (a table read from ``methods_dir`` may hold fewer entries per
    source subword, or fewer frequent subwords, than the grid asks for: the point uses what it holds)."""
    if method != "shortlist" or artifact is None:
        return point
    fitted = dict(point)
    for name in ("k", "frequent"):
        built = artifact.params.get(name)
        if isinstance(fitted.get(name), int) and isinstance(built, int) and fitted[name] > built:
            fitted[name] = built
    return fitted


def label(method: str, point: dict[str, Any]) -> str:
    """A point's name in tables and plots, e.g. ``lsh k=500``."""
    return " ".join([method, *(f"{k}={v}" for k, v in point.items())])


# ------------------------------------------------------------------------------------------------ measuring


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measure_beam(
    adapter: Seq2SeqAdapter,
    projs: dict[str, tuple[str, dict[str, Any], Metered]],
    artifacts: dict[str, Artifact],
    seqs: Sequence[list[int]],
    refs: Sequence[str],
    src: str,
    tgt: str,
    beam: int,
    settings: BenchSettings,
    scorer: Scorer,
) -> list[dict[str, Any]]:
    """One row per grid point (``projs``: label -> (method, point, metered projection)); ``full`` first."""
    args = (src, tgt, beam, settings.batch_size, settings.max_len, settings.length_penalty)
    warm = seqs[: min(len(seqs), settings.warmup)]
    memory: dict[str, dict[str, Any]] = {}
    began: dict[str, float] = {}
    for name, (_, _, p) in projs.items():  # each method alone: warm-up and its memory peak
        began[name] = time.time()
        memory[name] = measure_peak(functools.partial(decode_all, adapter, {name: p}, warm, *args))
    everything = {name: p for name, (_, _, p) in projs.items()}
    proj_s: dict[str, list[float]] = {n: [] for n in projs}
    counts: dict[str, tuple[float | None, int]] = {}

    def read_meters(rep: int) -> None:
        for name, p in everything.items():
            proj_s[name].append(p.seconds)
            if rep == 0:
                counts[name] = (p.per_row, p.calls)

    passes = decode_passes(
        adapter, everything, seqs, args, settings.repeats, after_pass=read_meters, warm_up=False
    )
    full_name = next(n for n, (m, _, _) in projs.items() if m == "full")
    ref = Reference.of(passes, full_name, scorer, adapter, refs)
    full_proj = _median(proj_s[full_name])
    rows = []
    for name, (method, point, p) in projs.items():
        psec = _median(proj_s[name])
        per_row, calls = counts[name]
        art = artifacts.get(method)
        rows.append(
            {
                "direction": f"{src}-{tgt}",
                "beam": beam,
                "batch": settings.batch_size,
                "method": method,
                "label": name,
                "point": point,
                "options": p.options(),
                "sentences": len(passes.outputs[name]),
                **ref.compare(passes, name, scorer, adapter, refs),
                "candidates_per_row": None if per_row is None else round(per_row, 1),
                "candidate_fraction": None if per_row is None else round(per_row / adapter.n_vocab, 5),
                "projection_seconds_full": round(full_proj, 4),
                "projection_seconds": round(psec, 4),
                "projection_ratio": round(full_proj / psec, 3) if psec > 0 else None,
                "projection_calls": calls,
                # exact: the share of rows with an exactness certificate (the rest ran the full projection)
                "certified": p.projection.stats().get("certified_fraction"),
                **memory[name],
                "build_seconds": None if art is None else art.build_seconds,
                "artifact_bytes": None if art is None else art.nbytes,
                "artifact": None if art is None else art.source,
                "unstable_across_repeats": name in passes.unstable,
            }
        )
    ended = time.time()
    for row in rows:
        row.update(started=began[str(row["label"])], ended=ended)
    return rows


def run_bench(
    adapter: Seq2SeqAdapter,
    corpus: str | Path,
    maps: str | Path | None,
    directions: Sequence[str],
    settings: BenchSettings,
    methods_dir: str | Path | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every direction x beam x grid point of ``settings`` (see the module's docstring)."""
    note = on_note or (lambda _msg: None)
    sync = adapter.device.type == "cuda"
    methods = ["full", *(m for m in settings.methods if m != "full")]
    if any(m in CLUSTERED for m in methods) and maps is None:
        raise ValueError("clustered and per-row need cluster maps (--maps)")
    model_wide: dict[str, Artifact] = {}
    results: list[dict[str, Any]] = []
    for direction in directions:
        src, _, tgt = direction.partition("-")
        limit = settings.n_sentences or None
        _, sources, refs = read_direction(corpus, src, tgt, settings.split, limit=limit)
        keep = [i for i, s in enumerate(sources) if s.strip()]
        sources, refs = [sources[i] for i in keep], [refs[i] for i in keep]
        seqs = adapter.tokenize(sources, src, tgt)
        artifacts: dict[str, Artifact] = {}
        for m in methods:
            if m in CLUSTERED and "cluster" not in artifacts:
                assert maps is not None  # checked above
                folder = resolve_map_dir(maps, src, tgt)
                cmap = load_cluster_map(folder, expect_fingerprint=adapter.fingerprint)
                artifacts["cluster"] = Artifact("clustered", cmap, None, _folder_bytes(folder), str(folder))
            if m in CLUSTERED:
                artifacts[m] = artifacts["cluster"]
            elif m in INDEXED_METHODS:
                cached = model_wide.get(m)
                if cached is None:
                    params = settings.artifact(m)
                    note(f"{direction}: {m} artifact ...")
                    cached = get_artifact(adapter, m, direction, params, corpus, methods_dir)
                    note(f"{direction}: {m}: {cached.source}, {cached.build_seconds} s, {cached.nbytes} B")
                    from fastvocab.tasks.methods import MODEL_WIDE

                    if m in MODEL_WIDE:
                        model_wide[m] = cached
                artifacts[m] = cached
        full = make_projection(adapter, "full")
        scorer = Scorer(adapter, full, seqs, tgt, settings.max_len, settings.length_penalty)
        for beam in settings.beams:
            projs: dict[str, tuple[str, dict[str, Any], Metered]] = {}
            for m in methods:
                for point in settings.grid_points(m):
                    point = fit_point(m, point, artifacts.get(m))
                    if label(m, point) in projs:  # two points the same once fitted
                        continue
                    opts = point_options(m, point, beam, artifacts.get(m), direction)
                    method = "clustered" if m in CLUSTERED else m
                    proj = Metered(make_projection(adapter, method, **opts), sync)
                    projs[label(m, point)] = (m, point, proj)
            rows = measure_beam(adapter, projs, artifacts, seqs, refs, src, tgt, beam, settings, scorer)
            for row in rows:
                if on_row is not None:
                    on_row(row)
            results += rows
    return results


# ------------------------------------------------------------------------------------------------ reporting

TABLE_HEADER = (
    f"{'dir':<6} {'beam':>4} {'point':<34} {'ident':>6} {'s.err':>6} {'BLEU':>6} {'chrF':>6} "
    f"{'cand/row':>9} {'sent/s':>7} {'ratio':>6} {'proj':>6} {'RSS MiB':>8} {'build s':>8} {'bytes':>10}"
)


def format_row(row: dict[str, Any]) -> str:
    def num(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return (
        f"{row['direction']:<6} {row['beam']:>4} {str(row['label'])[:34]:<34} {row['identical']:>6.3f} "
        f"{row['search_errors']:>6.3f} {row['bleu']:>6.2f} {row['chrf']:>6.2f} "
        f"{num(row['candidates_per_row'], '.0f'):>9} {row['sent_per_s']:>7.2f} {row['speed_ratio']:>6.2f} "
        f"{num(row['projection_ratio'], '.2f'):>6} {num(row['rss_peak_mib'], '.0f'):>8} "
        f"{num(row['build_seconds'], '.2f'):>8} {num(row['artifact_bytes'], 'd'):>10}"
    )


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats (lower or equal error and higher or equal speed, one
    strictly), sorted by error."""
    front = []
    for i, (e, s) in enumerate(points):
        dominated = any(
            (e2 <= e and s2 >= s) and (e2 < e or s2 > s) for j, (e2, s2) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def plot_speed_vs_errors(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Speed ratio to full against search error rate, one panel per direction and beam, one curve per
    method, the Pareto front marked. Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(str(r["direction"]), int(r["beam"])) for r in rows})
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.2 * max(len(panels), 1), 4.4), squeeze=False)
    markers = dict(zip(METHODS, ["s", "o", "^", "v", "D", "P"], strict=True))
    for ax, (direction, beam) in zip(axes[0], panels, strict=False):
        sub = [r for r in rows if r["direction"] == direction and r["beam"] == beam]
        for method in METHODS:
            mine = sorted((r for r in sub if r["method"] == method), key=lambda r: r["search_errors"])
            if not mine:
                continue
            ax.plot(
                [r["search_errors"] for r in mine],
                [r["speed_ratio"] for r in mine],
                marker=markers[method],
                label=method,
            )
        pts = [(float(r["search_errors"]), float(r["speed_ratio"])) for r in sub]
        front = pareto_front(pts)
        if front:
            ax.plot(
                [pts[i][0] for i in front],
                [pts[i][1] for i in front],
                linestyle="--",
                color="black",
                marker="o",
                markerfacecolor="none",
                markersize=12,
                label="Pareto front",
            )
        ax.axhline(1.0, color="grey", linewidth=0.5)
        ax.set_xlabel("search error rate (vs full softmax)")
        ax.set_ylabel("speed (sentences/s ratio to full)")
        ax.set_title(f"{direction}, beam {beam}")
        ax.set_xlim(-0.03, 1.03)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# when a row's work ran (seconds since the epoch): its MLflow run's span, not a number it measured
SPAN_KEYS = ("started", "ended")


def numeric_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A row's finite numbers (MLflow metrics), its span (:data:`SPAN_KEYS`) aside."""
    return {
        k: float(v)
        for k, v in row.items()
        if k not in SPAN_KEYS
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(float(v))
    }


def span(rows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """When the work behind ``rows`` started and ended (their earliest ``started``, latest ``ended``; None
    where no row says): the ``started`` and ``ended`` of the MLflow record that stands for them."""
    starts = [float(r["started"]) for r in rows if r.get("started") is not None]
    ends = [float(r["ended"]) for r in rows if r.get("ended") is not None]
    return (min(starts) if starts else None, max(ends) if ends else None)


def bench_record(
    results: list[dict[str, Any]],
    *,
    command: str,
    meta: dict[str, Any],
    settings: BenchSettings,
) -> dict[str, Any]:
    """The JSON record: command, meta (device, model, settings, load), results, the Pareto front's labels."""
    front: dict[str, list[str]] = {}
    for direction, beam in sorted({(str(r["direction"]), int(r["beam"])) for r in results}):
        sub = [r for r in results if r["direction"] == direction and r["beam"] == beam]
        idx = pareto_front([(float(r["search_errors"]), float(r["speed_ratio"])) for r in sub])
        front[f"{direction} beam {beam}"] = [str(sub[i]["label"]) for i in idx]
    return {
        "benchmark": "methods",
        "command": command,
        "meta": {**meta, **settings.describe()},
        "pareto_front": front,
        "results": results,
    }

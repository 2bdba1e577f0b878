"""Typed configuration: one YAML file validated by pydantic models; CLI flags override single fields.

Unknown keys and wrong types fail at load time with the offending key named (``extra="forbid"``). Each stage
section turns into the typed parameters its task takes (``DumpConfig.settings()`` -> ``DumpSettings``, ...):
stages never pass untyped dicts to tasks.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fastvocab.artifacts_schema.bulk_parts import PART_LINES
from fastvocab.decoding.settings import ENGINES, SearchSettings
from fastvocab.kernels.clustered_parts import ClusteredOptions, InactiveMassChoice, SelectionName
from fastvocab.pipeline.errors import UserError

if TYPE_CHECKING:
    from fastvocab.kernels.graph import GraphParams
    from fastvocab.kernels.lsh import LshParams
    from fastvocab.kernels.options import ArtifactPath
    from fastvocab.tasks.dump import DumpSettings
    from fastvocab.tasks.kmeans import KMeansParams
    from fastvocab.tasks.maps import MapParams
    from fastvocab.tasks.shortlist import ShortlistParams

# Per-cluster active fractions are also reported at these K (Amer et al. Fig. 4).
COMPARE_KS = (1, 3, 5)


def beam_k(beams: list[int]) -> int:
    """The top-K a map for these beams needs per state: beam search extends each hypothesis with its
    ``2 x beam`` best tokens (greedy search with its best one)."""
    return max(1 if b == 1 else 2 * b for b in beams)


def parse_direction(direction: str) -> tuple[str, str]:
    """``"en-it"`` -> ``("en", "it")``; ValueError for anything else, or a source equal to its target."""
    src, sep, tgt = direction.partition("-")
    if not sep or not src or not tgt or "-" in tgt or not (src + tgt).replace("_", "").isalnum():
        raise ValueError(f"direction {direction!r} must look like 'en-it' (source-target language codes)")
    if src == tgt:
        raise ValueError(f"direction {direction!r}: source and target are the same language")
    return src, tgt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


# Debian packages that ship many translated gettext catalogs (the Debian 12 names; gettext-base holds
# gettext-runtime's catalogs, login shadow's, binutils-common binutils', util-linux-locales util-linux's).
CATALOG_PACKAGES = [
    "coreutils", "tar", "grep", "sed", "findutils", "diffutils", "cpio", "bash", "apt", "dpkg", "gettext",
    "gettext-base", "wget", "make", "nano", "sudo", "man-db", "login", "procps", "binutils-common",
    "util-linux-locales", "e2fsprogs-l10n", "gnupg-l10n",
]  # fmt: skip


class CatalogsConfig(_Strict):
    """``fastvocab corpus --catalogs``: pairs from the gettext message catalogs of Debian packages, in the
    corpus layout of their own folder (tasks/catalog_corpus.py). Languages, pivot, split sizes and seed are
    the corpus section's."""

    out_dir: Path = Path("data/catalogs")
    # fetched with apt-get download (name, or name=version), unpacked into out_dir, nothing installed
    packages: list[str] = CATALOG_PACKAGES
    # read the machine's own catalogs (system_dir/<locale>/LC_MESSAGES/*.mo) instead of the packages'
    from_system: bool = False
    system_dir: Path = Path("/usr/share/locale")
    lists_dir: Path | None = None  # private apt lists folder; default: <out_dir>/apt-lists
    # corpus folders whose dev and test sentences of the same pair no catalog split may hold; null: the
    # description corpus, corpus.out_dir
    hold_out: list[Path] | None = None

    def hold_out_dirs(self, corpus_dir: Path) -> list[Path]:
        return [corpus_dir] if self.hold_out is None else list(self.hold_out)


class CorpusConfig(_Strict):
    out_dir: Path = Path("data/corpus")
    languages: list[str] = ["en", "it", "fr", "de", "es", "pt"]
    pivot: str = "en"  # pairs are pivot-xx, as in the Debian translations
    dev_size: int = Field(1000, ge=0)
    test_size: int = Field(1000, ge=0)
    seed: int = 0
    lists_dir: Path | None = None  # apt lists folder to reuse; default: <out_dir>/apt-lists
    # also each language's Debian descriptions as its monolingual file (mono/<lang>.parquet), which the dump
    # source "mono" reads
    mono: bool = False
    catalogs: CatalogsConfig = CatalogsConfig()


class TranslateConfig(_Strict):
    # the clustered method's options: kernels.clustered_parts.ClusteredOptions, whose fields hold the defaults
    # and check their values (tests/test_method_options.py keeps these keys its fields)
    # rows share the union of their sets, or not
    selection: SelectionName = ClusteredOptions.selection
    # estimate of the mass of the columns not computed (auto: none for greedy, the measured best for beam
    # search: kernels/clustered_parts.py BEAM_INACTIVE_MASS, SHORTLIST_BEAM_INACTIVE_MASS with a shortlist)
    inactive_mass: InactiveMassChoice = ClusteredOptions.inactive_mass
    # rows without an exactness certificate get the full projection
    exact: bool = ClusteredOptions.exact
    # union selection: each row adds the sets of its `probes` nearest clusters (1: the nearest); null: the
    # map's own (maps.probes, recorded in it)
    probes: int | None = ClusteredOptions.probes
    # clustered, union selection: a folder of lexical shortlist tables (<DIR>/shortlist/<src>-<tgt>, as the
    # methods stage and maps shipped beside a model lay them out); the candidates of each batch's sentences
    # join every clustered method's sets (null: none)
    shortlist: Path | None = None
    # the search (decoding.settings.SearchSettings, whose fields hold the defaults)
    beam: int = Field(SearchSettings.beam, ge=1)
    batch_size: int = Field(SearchSettings.batch_size, ge=1)
    max_len: int = Field(SearchSettings.max_len, ge=1)  # max target tokens per sentence
    # longer source lines are an error, not silently cut
    max_input_tokens: int = Field(SearchSettings.max_input_tokens, ge=1)
    length_penalty: float = SearchSettings.length_penalty
    # beam search's stopping rule (true, false, never), as generate's early_stopping; null: the model's own
    early_stopping: bool | Literal["never"] | None = Field(SearchSettings.early_stopping)
    # the whole decoding step in CUDA graphs (decoding.steppers.use_graphs): on, off, or auto (captured on
    # CUDA where the step can be, eager otherwise)
    graphs: Literal["auto", "on", "off"] = Field(SearchSettings.graphs)
    device: str = "cpu"
    # the decoder-step engine (fastvocab translate --engine): auto (onnx on CPU in float32 where the cache
    # folder can keep its export, static otherwise, hf for a family without the static step:
    # docs/decisions/0021-auto-is-onnx-on-cpu.md), static, hf, or onnx (the decoder's and the encoder's
    # layers in ONNX Runtime: docs/decisions/0009-onnx-runtime-decoder-body.md, docs/cpu-engine.md 0013)
    engine: str = "auto"

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        # the name only: the driver may have no GPU where the workers' nodes do
        from fastvocab.pipeline.checks import check_device_name

        check_device_name(value, "translate.device")
        return value

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str) -> str:
        if value not in ENGINES:
            raise ValueError(f"must be one of {', '.join(ENGINES)}")
        return value

    @model_validator(mode="after")
    def _check_clustered(self) -> TranslateConfig:
        self.clustered("<map>", self.shortlist)  # the options' own rules (ValueError naming the option)
        return self

    def search(self) -> SearchSettings:
        """The search fields as the settings translation takes (the fields are named alike)."""
        return SearchSettings(**{f.name: getattr(self, f.name) for f in fields(SearchSettings)})

    def clustered(self, cluster_map: ArtifactPath, shortlist: ArtifactPath | None = None) -> ClusteredOptions:
        """The clustered method's options with this map and shortlist table, found for a direction (the other
        methods' options are not in the config: they decode with their defaults)."""
        return ClusteredOptions(
            cluster_map,
            selection=self.selection,
            probes=self.probes,
            inactive_mass=self.inactive_mass,
            exact=self.exact,
            shortlist=shortlist,
        )


# The dump's sentences a batch by where it decodes. On a 1-thread CPU worker the batch hardly matters
# (1,184, 1,306 and 1,156 states/s at 32, 64 and 128: benchmarks/results/dump-batch-cpu-2026-11-27-b*.json),
# and 32 keeps the plans of dumps made before. On an H200 512 ran fastest (145K states/s captured, against
# 119K at 2,048 and 69K at 4,096: benchmarks/gpu.md).
DUMP_BATCH_CPU = 32
DUMP_BATCH_GPU = 512


class DumpConfig(_Strict):
    # what a direction's dump reads, in order (tasks/dump_sources.py): "train" (the pair's train split, with
    # its references), "catalogs" (its train split in the catalog corpus, corpus.catalogs.out_dir, with
    # references; built by the corpus stage when missing), "pairs" (the source side of the other pairs'
    # train splits), "mono" (<corpus>/mono/<src>.parquet), or a path (a text file, or a Parquet file,
    # folder or glob); lines de-duplicated, and no dev or test line of either corpus
    sources: list[str] = ["train"]
    # sentences per direction whose states are stored (the first ones; "all": every line of the sources)
    sentences: int | Literal["all"] = 2000
    max_states: int | None = Field(None, ge=1)  # cap on stored states per direction
    # further sentences: counts only, states not stored ("all": every line after the stored ones)
    stream_sentences: int | Literal["all"] = 0
    # also record the states along each line's reference translation, where its source has one (teacher
    # forcing: one batched decoder pass, no search), stored and streamed like a beam's
    reference: bool = False
    # top-K ids recorded per state; raised to 2 x the largest of maps.beams when lower (beam search keeps the
    # 2 x beam best tokens of every hypothesis)
    k: int = Field(5, ge=1)
    # sentences a batch; auto: DUMP_BATCH_GPU on GPU workers (num_gpus_per_worker > 0), else DUMP_BATCH_CPU
    batch_size: int | Literal["auto"] = "auto"
    # the greedy dump's step in CUDA graphs: auto (captured on a GPU worker where it can be captured), on,
    # off. A captured dump's shards say so in their plan (fixed shapes round fp16 differently).
    graphs: Literal["auto", "on", "off"] = "auto"
    shard_rows: int = Field(50_000, ge=1)  # Parquet row-group size inside a shard
    num_workers: int = Field(2, ge=1)
    num_gpus_per_worker: float = Field(0.0, ge=0)
    shard_sentences: int = Field(500, ge=1)  # sentences per shard (the unit of work, resume and parallelism)
    max_len: int = Field(SearchSettings.max_len, ge=1)  # max target tokens decoded per sentence
    torch_threads: int | None = Field(None, ge=1)  # per worker; default: Ray CPUs / workers (>= 1)
    # source lines of more tokens are left out of the dump (translate refuses them: no map needs them)
    max_input_tokens: int = Field(SearchSettings.max_input_tokens, ge=1)

    @field_validator("batch_size")
    @classmethod
    def _check_batch(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be >= 1 or 'auto', got {value}")
        return value

    def batch(self) -> int:
        """Sentences a batch, ``auto`` resolved by where the workers decode."""
        if self.batch_size != "auto":
            return self.batch_size
        return DUMP_BATCH_GPU if self.num_gpus_per_worker > 0 else DUMP_BATCH_CPU

    @field_validator("sentences", "stream_sentences")
    @classmethod
    def _check_count(cls, value: int | str, info) -> int | str:
        least = 1 if info.field_name == "sentences" else 0
        if isinstance(value, int) and value < least:
            raise ValueError(f"must be >= {least} or 'all', got {value}")
        return value

    @field_validator("sources")
    @classmethod
    def _check_sources(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one source is needed, e.g. [train]")
        dup = sorted({s for s in value if value.count(s) > 1})
        if dup:
            raise ValueError(f"{', '.join(dup)} listed more than once")
        held = [s for s in value if s in ("dev", "test")]
        if held:
            raise ValueError(f"{held[0]!r} is held out for measuring the maps: it is never dumped")
        return value

    def settings(self, beam: int = 1) -> DumpSettings:
        """How the states along ``beam`` (1: the greedy path) are decoded and recorded."""
        from fastvocab.tasks.dump import DumpSettings

        graphs = self.graphs if beam == 1 else "off"  # the captured recording is the greedy path's
        return DumpSettings(
            k=self.k,
            max_len=self.max_len,
            batch_size=self.batch(),
            beam=beam,
            graphs=graphs,
            max_input_tokens=self.max_input_tokens,
        )


class KMeansConfig(_Strict):
    r: int = Field(200, ge=1)
    niter: int = Field(20, ge=1)
    seed: int = 1234
    max_points_per_centroid: int = Field(256, ge=1)
    gpu: bool = False
    num_cpus: int = Field(1, ge=1)  # CPUs per k-means Ray task = Faiss OpenMP threads (fixed: determinism)

    def params(self, gpu: bool) -> KMeansParams:
        """The task's parameters; ``gpu`` is what the cluster can honour (``self.gpu`` is the request)."""
        from fastvocab.tasks.kmeans import KMeansParams

        return KMeansParams(
            r=self.r,
            niter=self.niter,
            seed=self.seed,
            max_points_per_centroid=self.max_points_per_centroid,
            gpu=gpu,
            threads=self.num_cpus,
        )


class MapsConfig(_Strict):
    # which states feed a map: one direction (source and target known), or all into a target language
    scope: Literal["direction", "target"] = "direction"
    k: int | None = Field(None, ge=1)  # top-K used for the active sets (<= dump.k); default dump.k
    # the beam sizes the maps serve: the dump decodes its sentences (stored and streamed) along each, greedy
    # for 1, full-softmax beam search for b > 1, and k-means and the maps read them all
    beams: list[int] = [1]
    min_count: int = Field(1, ge=1)
    # the probes the maps record for decoding (used where translate.probes and --probes are unset): how many
    # nearest clusters' sets each row adds to a union batch's columns (1: the nearest, Amer et al.'s method)
    probes: int = Field(1, ge=1)
    # basis of the stored normaliser's curvature (inactive_mass: normaliser); 0 = isotropic only; default
    # the maps' own (kernels.clustered_load.DEFAULT_NORMALISER_RANK)
    normaliser_rank: int | None = Field(None, ge=0)
    # states folders of dumps made elsewhere (another run's <work_dir>/states, every beam under it) that
    # k-means and the maps read with this run's own
    extra_states: list[str] = []
    # also write the maps, with the record of how they were built, to this folder (maps shipped beside the
    # model: tasks/publish.py)
    publish: Path | None = None

    @field_validator("beams")
    @classmethod
    def _check_beams(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("at least one beam size is needed, e.g. [1] (greedy) or [1, 4]")
        bad = [b for b in value if b < 1]
        if bad:
            raise ValueError(f"beam sizes must be >= 1, got {bad}")
        dup = sorted({b for b in value if value.count(b) > 1})
        if dup:
            raise ValueError(f"{', '.join(map(str, dup))} listed more than once")
        return sorted(value)

    def params(self, dump_k: int) -> MapParams:
        from fastvocab.tasks.maps import MapParams

        k = self.k or dump_k
        if k > dump_k:
            raise UserError(
                f"maps.k={k} exceeds dump.k={dump_k}: the dump recorded only {dump_k} ids per state"
            )
        rank = {} if self.normaliser_rank is None else {"normaliser_rank": self.normaliser_rank}
        return MapParams(
            scope=self.scope,
            k=k,
            min_count=self.min_count,
            probes=self.probes,
            compare_ks=tuple(c for c in COMPARE_KS if c < k),
            **rank,
        )


class EvalConfig(_Strict):
    split: str = "test"
    sentences: int = Field(200, ge=1)
    methods: list[str] = ["full", "clustered"]
    # maps built elsewhere, evaluated beside the run's own: name -> a folder holding one map per direction
    # (as maps/ does), each run as the method "clustered-<name>" (e.g. the maps shipped beside the model)
    maps: dict[str, Path] = {}

    @field_validator("maps")
    @classmethod
    def _check_maps(cls, value: dict[str, Path]) -> dict[str, Path]:
        bad = [n for n in value if not n or not n.replace("_", "").replace("-", "").isalnum()]
        if bad:
            raise ValueError(f"map names are letters, digits, '-' and '_' (they name a method): {bad}")
        return value

    def labels(self) -> list[str]:
        """Every method the evaluation runs, as its outputs and metrics name it."""
        return [*self.methods, *(f"clustered-{name}" for name in self.maps)]


class LshIndexConfig(_Strict):
    """The ``lsh`` artifact: SimHash codes of W (kernels/lsh.py)."""

    bits: int = Field(256, ge=1)  # c, hash bits per vector
    seed: int = 0  # of the random rotation
    rotate: bool | None = None  # None: rotate when bits != d (Marian, Faiss IndexLSH)

    def params(self) -> LshParams:
        from fastvocab.kernels.lsh import LshParams

        return LshParams(bits=self.bits, seed=self.seed, rotate=self.rotate)


class GraphIndexConfig(_Strict):
    """The ``graph`` artifact: an inner-product HNSW graph over W fused with b (FGD, kernels/graph.py)."""

    m: int = Field(32, ge=2)  # neighbours per node (FGD's M)
    ef_construction: int = Field(200, ge=1)
    threads: int = Field(1, ge=1)  # Faiss threads (= Ray CPUs) while building; 1: a reproducible graph

    def params(self) -> GraphParams:
        from fastvocab.kernels.graph import GraphParams

        return GraphParams(m=self.m, ef_construction=self.ef_construction, threads=self.threads)


class ShortlistIndexConfig(_Strict):
    """The ``shortlist`` artifacts: one lexical table per direction, learned (IBM Model 1) from the corpus's
    train split with the model's tokenizer (tasks/shortlist.py)."""

    k: int = Field(100, ge=1)  # target subwords kept per source subword, by p(t | s)
    frequent: int = Field(100, ge=0)  # most frequent target subwords, candidates of every sentence
    iterations: int = Field(5, ge=1)  # IBM-1 EM iterations
    max_tokens: int = Field(128, ge=1)  # pairs longer than this (subwords) on either side are skipped
    max_sentences: int | None = Field(None, ge=1)  # the first pairs of the train split only (None: all)
    min_prob: float = Field(0.0, ge=0.0, lt=1.0)  # table entries below this probability are dropped

    def params(self) -> ShortlistParams:
        from fastvocab.tasks.shortlist import ShortlistParams

        return ShortlistParams(
            k=self.k,
            frequent=self.frequent,
            iterations=self.iterations,
            max_tokens=self.max_tokens,
            max_sentences=self.max_sentences,
            min_prob=self.min_prob,
        )


class MethodsConfig(_Strict):
    """Offline artifacts of the other output-layer methods, built by the ``methods`` stage (default: none)."""

    build: list[str] = []  # methods whose artifacts are built: lsh, graph, shortlist
    # also copy the artifacts to this folder, laid out as <work_dir>/methods (e.g. the shortlist tables
    # shipped beside a model, which translate.shortlist and translate --with-shortlist read)
    publish: Path | None = None
    lsh: LshIndexConfig = LshIndexConfig()
    graph: GraphIndexConfig = GraphIndexConfig()
    shortlist: ShortlistIndexConfig = ShortlistIndexConfig()

    @field_validator("build")
    @classmethod
    def _check_build(cls, value: list[str]) -> list[str]:
        from fastvocab.tasks.methods import BUILDERS

        unknown = [m for m in value if m not in BUILDERS]
        if unknown:
            valid = ", ".join(sorted(BUILDERS))
            raise ValueError(f"no offline artifact for {', '.join(unknown)}; valid: {valid}")
        dup = sorted({m for m in value if value.count(m) > 1})
        if dup:
            raise ValueError(f"{', '.join(dup)} listed more than once")
        return value

    def params(self, method: str) -> object:
        """The typed parameters of ``method``'s artifact (its section's ``params()``)."""
        section = getattr(self, method, None)
        if section is None or not hasattr(section, "params"):
            raise UserError(f"methods.build names {method!r}, but the config has no methods.{method} section")
        return section.params()


class BulkConfig(_Strict):
    """Bulk translation of a corpus as a stage of ``fastvocab run`` (the ``bulk`` stage;
    pipeline/bulk_driver.py): off unless ``input`` is set. Search settings and the clustered options come
    from ``translate``."""

    input: str | None = None  # text file, Parquet file, folder (hive partitions too) or glob
    output: str | None = None  # text file, .parquet, or a folder ending in / (default <work_dir>/bulk/<dir>/)
    direction: str | None = None  # default: the first of ``directions``
    method: str = "full"  # full, clustered (the run's map, or ``clusters``), lsh, graph, shortlist
    clusters: Path | None = None  # clustered: map folder, or a folder of them (default: <work_dir>/maps)
    # lsh, graph, shortlist: the artifact, its folder or a methods root (default: shortlist <work_dir>'s
    # methods; lsh and graph build theirs from W at load)
    index: Path | None = None
    dtype: Literal["float32", "float16", "bfloat16", "int8"] = "float32"
    workers: int = Field(1, ge=1)  # Ray actors; 1 without ray_address: in the driver's process
    num_cpus_per_worker: int = Field(1, ge=1)  # CPUs (torch threads) each actor reserves
    num_gpus_per_worker: float = Field(0.0, ge=0)
    chunk_lines: int = Field(PART_LINES, ge=1)  # lines a part (the unit of work and of resume)
    input_column: str | None = None  # Parquet text column (default: text, else source)
    id_column: str = "id"  # Parquet id column, used when present (integer or string)

    @field_validator("direction")
    @classmethod
    def _check_direction(cls, value: str | None) -> str | None:
        if value is not None:
            parse_direction(value)
        return value


class RunConfig(_Strict):
    """A whole pipeline run (``fastvocab run CONFIG``)."""

    work_dir: Path = Path("runs/demo")
    model: Path = Path("models/demo")
    directions: list[str] = ["en-it", "it-en"]
    corpus: CorpusConfig = CorpusConfig()
    dump: DumpConfig = DumpConfig()
    kmeans: KMeansConfig = KMeansConfig()
    maps: MapsConfig = MapsConfig()
    translate: TranslateConfig = TranslateConfig()
    eval: EvalConfig = EvalConfig()
    methods: MethodsConfig = MethodsConfig()
    bulk: BulkConfig = BulkConfig()  # off unless bulk.input is set
    ray_address: str | None = None  # None: local ray.init(); "auto" or "ray://host:port" for a cluster
    ray_num_cpus: int | None = Field(None, ge=1)  # CPUs of a local Ray session; default os.cpu_count()
    mlflow_tracking_uri: str | None = (
        None  # None: $MLFLOW_TRACKING_URI, else sqlite:///<work_dir>/mlflow.db (tracking.resolve_store)
    )
    mlflow_experiment: str = "fastvocab"

    @field_validator("directions")
    @classmethod
    def _check_directions(cls, value: list[str]) -> list[str]:
        # refused here, at load time: nothing may run (not even the corpus stage) for a bad direction
        if not value:
            raise ValueError("at least one direction is needed, e.g. [en-it]")
        for direction in value:
            parse_direction(direction)
        dup = sorted({d for d in value if value.count(d) > 1})
        if dup:
            raise ValueError(f"{', '.join(dup)} listed more than once")
        return value

    @model_validator(mode="after")
    def _k_follows_the_beams(self) -> RunConfig:
        """dump.k and maps.k are raised to what the beams need."""
        # states dumped along beam b carry their 2 x b best ids, and a map that keeps fewer drops what they
        # were dumped for: both K follow the beams (the K used is logged with every stage's parameters)
        need = beam_k(self.maps.beams)
        self.dump.k = max(self.dump.k, need)
        if self.maps.k is not None:
            self.maps.k = max(self.maps.k, need)
        return self


def load_config(path: str | Path | None, overrides: dict[str, object] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults when ``path`` is None) and apply dotted-key overrides.

    ``overrides={"kmeans.r": 500}`` sets ``kmeans.r``; values are validated like the file's.
    """
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise UserError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"config {path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise UserError(f"config {path} must be a mapping at the top level")
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value, str(path or "<defaults>"))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        where = f"{loc}: " if loc else ""  # a check across sections names its keys itself
        raise UserError(f"config {path or '<defaults>'}: {where}{msg}") from exc


def _set_dotted(data: dict, key: str, value: object, source: str) -> None:
    """Set ``data[a][b] = value`` for ``key="a.b"``, walking the config models so that a dotted key through
    a plain value (``work_dir.x``) or an unknown section is a one-line UserError, not a TypeError."""
    model: type[BaseModel] = RunConfig
    node = data
    *parents, leaf = key.split(".")
    if not all(part.strip() for part in key.split(".")):
        raise UserError(f"--set {key}: empty key part")
    for i, part in enumerate(parents):
        where = ".".join(parents[: i + 1])
        info = model.model_fields.get(part)
        if info is None:
            raise UserError(f"--set {key}: unknown config section {where!r}")
        sub = info.annotation
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            raise UserError(f"--set {key}: {where} is a single value, not a section with keys")
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise UserError(f"--set {key}: {where} in {source} is not a mapping")
        node, model = child, sub
    node[leaf] = value

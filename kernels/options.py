"""What a user chooses of an output-layer method, as one frozen dataclass per method, kept beside its
projection (``FullOptions`` in full.py, ``ClusteredOptions`` in clustered_parts.py, ``LshOptions``,
``GraphOptions``, ``ShortlistOptions``) and registered with it (``base.register(name, options)``).

The object travels whole from the ``fastvocab translate`` flags, the pipeline config or
``fastvocab.Translator`` down to :func:`~fastvocab.kernels.registry.build_projection`, which alone turns it
into the projection's keyword options. Each field holds its option's one default and, as a :class:`Flag` in
its metadata, how a user names it: the command line's method flags are made from these fields
(pipeline/commands/method_flags.py) and the config's keys are checked against them
(tests/test_method_options.py). A dataclass checks its values when it is made, with a ``ValueError`` naming
the option; the command line and the config turn that into their one-line error. This module imports nothing
heavy, so the configuration loads without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

ArtifactPath = str | Path  # a map or index folder, found and checked by the caller (resolved once a job)


@dataclass(frozen=True)
class Flag:
    """How a user names an option on the command line: ``name`` (``--candidates``), what it does
    (``help``, without the method's name or the default: both are added), and argparse's ``type``
    (``bool``: a switch), ``metavar`` and ``choices``. ``default``: what "(default: ...)" says where the
    field's default is None ("the projection's own"); ``needed``: for an option without a default, what to
    give (``--method shortlist needs --index (...)``)."""

    name: str
    help: str
    type: type = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    default: str | None = None
    needed: str | None = None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


def option(default: Any = None, flag: Flag | None = None) -> Any:
    """A field of a method's options: its default and how a user names it (None: set by the caller, never
    by a user: a shortlist's direction)."""
    return field(default=default, metadata={"flag": flag})


def required(flag: Flag) -> Any:
    """A field without a default (a method's own artifact: the clustered map, the shortlist table)."""
    return field(metadata={"flag": flag})


def flag_of(f: Any) -> Flag | None:
    """The :class:`Flag` of a dataclass field, or None."""
    return f.metadata.get("flag")


def check_count(name: str, value: object, least: int) -> None:
    """``value`` is None or an integer >= ``least`` (a bool is an int to Python, never a count to a user)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True)
class MethodOptions:
    """The options of one method (``method``); each method's dataclass derives from this one."""

    method: ClassVar[str] = "?"

    def projection_kwargs(self, beam: int = 1, int8: bool = False) -> dict[str, object]:
        """The projection class's keyword options for a search at ``beam`` (``int8``: the model decodes in
        int8, which only the full and clustered projections follow): every field that is not None. A method
        whose options depend on the beam or the dtype overrides it."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def artifact(self) -> str:
        """The folder the method reads (its map or index), as records name it; empty when it has none."""
        for name in ("cluster_map", "index"):
            value = getattr(self, name, None)
            if value is not None:
                return str(value)
        return ""


# The lsh, graph and shortlist methods' own artifact and their candidates, one flag each.
INDEX_FLAG = Flag(
    "--index",
    "the method's offline artifact: its folder (manifest.json), or a methods root (<DIR>/<method>/all for "
    "lsh and graph, <DIR>/shortlist/<src>-<tgt>), or a pipeline work dir (its methods/ root; built with "
    "methods.build). Required for shortlist; without it lsh hashes W and graph builds its HNSW index in "
    "memory at start (graph: tens of seconds)",
    type=Path,
    metavar="DIR",
    needed="a shortlist table of this model and direction: build it with fastvocab run, "
    "methods.build: [shortlist]",
)


def candidates_flag(help: str, default: str) -> Flag:
    """``--candidates K``, the method's ``k``."""
    return Flag("--candidates", help, type=int, metavar="K", default=default)

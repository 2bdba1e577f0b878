"""The ``pipeline`` extra: the optional modules some commands need, and the one-line error without them.

``pip install fastvocab`` installs what translation in this process needs (torch, transformers, ...). Ray,
MLflow, Faiss, Jinja2 and matplotlib come with ``pip install 'fastvocab[pipeline]'`` (pyproject.toml says why
one extra): ``fastvocab run``, ``translate --workers N`` or ``--ray-address``, ``--tracking-uri`` (MLflow
logging), ``--method graph`` (Faiss), ``report`` and the harnesses' MLflow logging need them.

Two layers, so a missing module is never a traceback:

- a command checks what it will need, before it loads a model, with :func:`require` (found without being
  imported: ``importlib.util.find_spec``), naming the flag that needs it;
- every import of one of these modules in the pipeline sits inside :func:`needed`, which turns its
  ``ModuleNotFoundError`` into the same error, for a caller that did not check first (the Python API).

Both raise :class:`MissingExtra`, a ``UserError``: the CLI prints it as one line and exits 2.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

from fastvocab.pipeline.errors import UserError

EXTRA = "pipeline"
INSTALL = f"pip install 'fastvocab[{EXTRA}]'"
# The extra's modules (import name -> the name a user knows): pyproject.toml's [project.optional-dependencies]
# pipeline, whose distributions install them (faiss-cpu: faiss).
MODULES = {"ray": "Ray", "mlflow": "MLflow", "faiss": "Faiss", "jinja2": "Jinja2", "matplotlib": "matplotlib"}


class MissingExtra(UserError):
    """A module of the ``pipeline`` extra is not installed; the message (:func:`missing`) says what to
    install.

    Made from its message alone, as every ``UserError`` is (a command re-raises one with its file names put
    back, Ray re-raises one from a worker)."""


def missing(modules: list[str], needed_by: str | None = None, instead: str | None = None) -> MissingExtra:
    """The error for ``modules`` (keys of :data:`MODULES`), needed by ``needed_by`` (``--workers 2``) if
    named; ``instead``: how to do without them."""
    names = [MODULES.get(m, m) for m in modules]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    verb = "is" if len(names) == 1 else "are"
    head = f"{listed} {verb} not installed"
    if needed_by:
        head = f"{needed_by} needs {listed}, which {verb} not installed"
    return MissingExtra(f"{head}: {INSTALL}" + (f" ({instead})" if instead else ""))


def installed(module: str) -> bool:
    """Whether top-level ``module`` can be imported, without importing it (None in ``sys.modules``, how a
    test or a wrapper hides a module, counts as absent)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a spec (a stand-in a test put there): present
        return True


def require(needed_by: str, *modules: str, instead: str | None = None) -> None:
    """Refuse, before any work, a command that needs ``modules`` (keys of :data:`MODULES`) of which some are
    not installed; ``needed_by`` names what needs them (``--workers 2``), ``instead`` how to do without."""
    absent = [m for m in MODULES if m in modules and not installed(m)]  # in one order, once each
    if absent:
        raise missing(absent, needed_by, instead)


@contextlib.contextmanager
def needed() -> Iterator[None]:
    """Around an import of the extra's modules: their ``ModuleNotFoundError`` becomes :class:`MissingExtra`.

    Only when one of :data:`MODULES` itself is missing: a module that one of them fails to find
    (``ray._raylet`` of a broken install of Ray, a dependency of MLflow) keeps its own error.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in MODULES or installed(top):
            raise
        raise missing([top]) from None

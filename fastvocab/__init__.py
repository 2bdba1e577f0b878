"""fastvocab: clustered vocabulary projection for fast multilingual MT decoding.

The rooms install as subpackages: ``fastvocab.artifacts_schema``, ``fastvocab.kernels``,
``fastvocab.decoding``, ``fastvocab.tasks``, ``fastvocab.experiments``, ``fastvocab.training`` and
``fastvocab.pipeline`` (see docs/ARCHITECTURE.md). ``fastvocab.Translator`` is the Python API
(docs/translate.md, "From Python").
"""

from __future__ import annotations

from pkgutil import extend_path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastvocab.pipeline.translator import Translator

# In the repository, this file's folder holds no rooms (they are top-level folders, mapped by setup.py), yet
# it shadows the installed package wherever the repository root comes first on sys.path (`python -m pytest`,
# `python -c`, subprocesses started there). So look for the subpackages in the installed copy too: the
# editable install's link tree under build/, or the wheel's fastvocab/ in site-packages. Loaded from the
# installed copy itself, this finds nothing more.
__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"

__all__ = ["Translator", "__version__"]


def __getattr__(name: str) -> object:
    # Translator is imported when first asked for: ``import fastvocab`` (which every room does, for
    # __version__) stays free of torch and of the pipeline
    if name == "Translator":
        from fastvocab.pipeline.translator import Translator

        return Translator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

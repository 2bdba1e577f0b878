"""Which packages fastvocab ships and where their sources are (all other metadata is in pyproject.toml).

The rooms are top-level folders (docs/ARCHITECTURE.md, "Rooms") that install as ``fastvocab.<room>``, so no
top-level ``tasks`` or ``pipeline`` lands in site-packages. setuptools maps a package to a folder with
``package_dir`` and a subpackage follows its parent (``fastvocab.pipeline.commands`` is
``pipeline/commands/``), but its automatic discovery cannot put the ``fastvocab.`` prefix in front of the
packages it finds under a mapped folder. So the list is built here, when the wheel (or the editable install)
is built: every folder with an ``__init__.py`` under a room. A new subpackage ships without touching the
packaging; tests/test_packaging.py builds the wheel and checks that it holds every module of every room.
"""

from setuptools import find_packages, setup

ROOMS = ("artifacts_schema", "kernels", "decoding", "tasks", "experiments", "training", "pipeline")

setup(
    package_dir={"fastvocab": "fastvocab", **{f"fastvocab.{room}": room for room in ROOMS}},
    packages=[
        "fastvocab",
        *(f"fastvocab.{name}" for name in find_packages(include=[*ROOMS, *(f"{room}.*" for room in ROOMS)])),
    ],
)

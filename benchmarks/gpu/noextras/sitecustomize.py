"""Make Ray, Faiss, MLflow and pydantic unimportable, as on the GPU campaign image (which lacks them).

``campaign.sh --smoke`` puts this folder first on ``PYTHONPATH``, so a smoke run on a machine that has them
fails exactly where a GPU run would (``ModuleNotFoundError``), before GPU time is spent.
"""

import importlib.abc
import sys

BLOCKED = ("ray", "faiss", "mlflow", "pydantic")


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {name!r} (blocked: absent on the GPU image)", name=name
            )
        return None


sys.meta_path.insert(0, _Block())

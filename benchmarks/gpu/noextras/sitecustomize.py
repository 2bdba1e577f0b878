"""Make Ray, Faiss, MLflow and pydantic look absent, as on the GPU campaign image (which lacks them).

``campaign.sh`` puts this folder first on ``PYTHONPATH``, so a smoke run on a machine that has them fails
exactly where a GPU run would (``ModuleNotFoundError``), before GPU time is spent. A ``None`` entry in
``sys.modules`` is how Python spells "not installed" for both ``import`` and ``importlib.util.find_spec``;
libraries that probe for optional packages (accelerate probes for MLflow) then see them absent and go on,
where a finder that raised would break their import.
"""

import sys

BLOCKED = ("ray", "faiss", "mlflow", "pydantic")

for _name in BLOCKED:
    sys.modules.setdefault(_name, None)

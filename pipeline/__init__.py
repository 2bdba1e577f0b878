"""Config, stage graph, Ray orchestration, MLflow logging and the ``fastvocab`` CLI."""

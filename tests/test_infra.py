"""The cluster deployment files (infra/), checked offline: no cluster or Docker engine exists here.

Each file is parsed (YAML; the Dockerfile line by line) and checked for what a mistake would
break: required keys, the image and entrypoint consistent with the project (modules and spec
files exist, the torch pair matches pyproject), token authentication everywhere, no dashboard
reachable from outside, secrets referenced (Kubernetes Secrets, AWS Secrets Manager), never
written inline.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
CLUSTER = INFRA / "aws" / "cluster.yaml"
RAYJOB = INFRA / "k8s" / "rayjob-paper.yaml"
MLFLOW = INFRA / "k8s" / "mlflow.yaml"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
IMAGE = "ghcr.io/npsemiseg/npsemiseg:0.1.0"

#: Values that look like credentials written into a file
SECRET_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),                                   # AWS access key id
    re.compile(r"(?i)aws_secret_access_key\s*[=:]\s*['\"]?[A-Za-z0-9/+]{30,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    # a key ending in password / secret / token assigned a literal (not $VAR, $(cmd), {ref} or <placeholder>)
    re.compile(r"(?i)\b[\w-]*(password|secret|token)['\"]?\s*[:=]\s*['\"]?(?![$({<])[A-Za-z0-9_\-+/=]{12,}"),
    re.compile(r"://[^/\s:@]+:[^/\s@$]+@"),                              # user:password@host in a URI
]


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _walk(node, path=()):
    """(path, value) of every scalar in a YAML tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, (*path, str(index)))
    else:
        yield path, node


def _module_exists(module: str) -> bool:
    parts = module.split(".")
    return (ROOT.joinpath(*parts).with_suffix(".py")).is_file() or (ROOT.joinpath(*parts) / "__init__.py").is_file()


def _check_python_command(command: str) -> None:
    """``python -m <module> [<spec path>]``: the module exists in the project and so does a spec path."""
    words = shlex.split(command)
    assert words[:2] == ["python", "-m"], command
    assert _module_exists(words[2]), f"module {words[2]} of {command!r} is not in the project"
    for word in words[3:]:
        if word.endswith((".yaml", ".yml")):
            assert (ROOT / word).is_file(), f"{word} of {command!r} does not exist"


# ----------------------------------------------------------------------------- secrets
@pytest.mark.parametrize("path", sorted(p for p in INFRA.rglob("*") if p.is_file()), ids=lambda p: str(p.relative_to(INFRA)))
def test_no_secret_is_written_in_infra_files(path):
    text = path.read_text()
    for pattern in SECRET_PATTERNS:
        match = pattern.search(text)
        assert match is None, f"{path}: looks like an inline credential: {match.group(0)!r}"


def test_the_secret_scan_catches_inline_credentials():
    """The patterns above fire on what they must catch (and leave references alone)."""
    leaks = ["password: hunter2hunter2hunter2", "RAY_AUTH_TOKEN=0123456789abcdef0123",
             "postgresql://mlflow:s3cr3t@postgres:5432/mlflow", "AKIAABCDEFGHIJKLMNOP"]
    fine = ["valueFrom: {secretKeyRef: {name: npsemiseg-mlflow, key: password}}",
            'RAY_AUTH_TOKEN="$(aws secretsmanager get-secret-value --secret-id npsemiseg/ray-token)"',
            "postgresql+psycopg2://mlflow@postgres:5432/mlflow", "secretName: npsemiseg-ray-token"]
    assert all(any(p.search(text) for p in SECRET_PATTERNS) for text in leaks)
    assert not any(p.search(text) for p in SECRET_PATTERNS for text in fine)


# ----------------------------------------------------------------------------- Dockerfile
def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        current += " " + stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            joined.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in joined]


def test_dockerfile_builds_the_project_with_the_pinned_torch_pair():
    instructions = _dockerfile_instructions()
    kinds = [kind for kind, _ in instructions]
    assert kinds[0] == "FROM" and kinds.count("CMD") <= 1
    base = instructions[0][1]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = re.search(r">=\s*3\.(\d+)", project["requires-python"]).group(1)
    python_version = re.search(r"python:3\.(\d+)", base)
    assert python_version and int(python_version.group(1)) >= int(minimum), base
    runs = " ".join(args for kind, args in instructions if kind == "RUN")
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=\[ ]", requirement, maxsplit=1)[0]
        if name in ("torch", "torchvision"):
            assert f'"{requirement}"' in runs, f"the image must install {requirement!r} as pyproject pins it"
    copied = [args.split()[0] for kind, args in instructions if kind == "COPY"]
    for package in ("npsemiseg", "semiseg_platform", "jobs", "pyproject.toml"):
        assert package in copied and (ROOT / package).exists(), package
    assert "import torch, torchvision, ray, mlflow" in runs  # the build fails if the stack does not import
    users = [args for kind, args in instructions if kind == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must not run as root"
    assert not any(kind in ("ENV", "ARG") and re.search(r"(?i)(password|secret|token)\w*=", args)
                   for kind, args in instructions), "no credential may be baked into the image"
    command = [args for kind, args in instructions if kind == "CMD"][0]
    _check_python_command(" ".join(yaml.safe_load(command)))


# ----------------------------------------------------------------------------- AWS cluster launcher
def test_cluster_launcher_has_a_cpu_head_gpu_workers_and_token_auth():
    config = yaml.safe_load(CLUSTER.read_text())
    for key in ("cluster_name", "provider", "auth", "available_node_types", "head_node_type", "docker",
                "head_start_ray_commands", "worker_start_ray_commands"):
        assert key in config, key
    assert config["provider"]["type"] == "aws"
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and head["max_workers"] == 0
    workers = [spec for name, spec in types.items() if name != config["head_node_type"]]
    assert workers and all(spec["resources"]["GPU"] >= 1 and spec["max_workers"] >= 1 for spec in workers)
    assert config["docker"]["image"] == IMAGE
    assert any("--gpus all" in option for option in config["docker"]["worker_run_options"])
    head_start = " ".join(config["head_start_ray_commands"])
    worker_start = " ".join(config["worker_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start  # reached through `ray dashboard` (SSH tunnel) only
    for start in (head_start, worker_start):
        assert "RAY_AUTH_MODE=token" in start and "RAY_AUTH_TOKEN=\"$(aws secretsmanager" in start
    # the security group admits SSH only
    permissions = config["provider"]["security_group"]["IpPermissions"]
    assert [(rule["FromPort"], rule["ToPort"]) for rule in permissions] == [(22, 22)]
    assert all(r["CidrIp"] != "0.0.0.0/0" for rule in permissions for r in rule["IpRanges"])


# ----------------------------------------------------------------------------- KubeRay
def _containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def test_rayjob_runs_the_paper_grid_with_token_auth_and_no_public_dashboard():
    documents = _documents(RAYJOB)
    job = next(doc for doc in documents if doc["kind"] == "RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    assert job["spec"]["entrypoint"] == "python -m jobs.grid jobs/specs/paper.yaml"
    _check_python_command(job["spec"]["entrypoint"])
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"]["mode"] == "token" and cluster["authOptions"]["secretName"]
    import ray

    assert cluster["rayVersion"] == ray.__version__  # the image's Ray is the project's
    head = cluster["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert head["rayStartParams"].get("num-gpus") == "0"
    pods = [head["template"]] + [group["template"] for group in cluster["workerGroupSpecs"]]
    for pod in pods:
        for container in _containers(pod):
            assert container["image"] == IMAGE
            env = {item["name"]: item for item in container.get("env", [])}
            for name in ("MLFLOW_TRACKING_PASSWORD", "AWS_SECRET_ACCESS_KEY"):
                assert "secretKeyRef" in env[name]["valueFrom"], f"{name} must come from a Secret"
            assert container["securityContext"]["runAsNonRoot"] is True
    assert all(int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1
               for group in cluster["workerGroupSpecs"])
    # nothing exposes the dashboard: no LoadBalancer / NodePort service, no Ingress; a NetworkPolicy guards the pods
    kinds = [doc["kind"] for doc in documents]
    assert "Ingress" not in kinds and "NetworkPolicy" in kinds
    config = next(doc for doc in documents if doc["kind"] == "ConfigMap")
    assert config["data"]["MLFLOW_TRACKING_URI"].startswith("http://mlflow.npsemiseg.svc")


def test_mlflow_deployment_uses_postgres_s3_basic_auth_and_secrets():
    documents = _documents(MLFLOW)
    by_kind: dict[str, list[dict]] = {}
    for doc in documents:
        by_kind.setdefault(doc["kind"], []).append(doc)
    assert all(service["spec"].get("type", "ClusterIP") == "ClusterIP" for service in by_kind["Service"])
    assert "Ingress" not in by_kind
    deployment = next(doc for doc in by_kind["Deployment"] if doc["metadata"]["name"] == "mlflow")
    container = _containers(deployment["spec"]["template"])[0]
    assert container["image"] == IMAGE
    command = container["command"] + container["args"]
    assert command[:4] == ["python", "-m", "mlflow", "server"]
    args = dict(arg.split("=", 1) for arg in container["args"])
    assert args["--backend-store-uri"].startswith("postgresql+psycopg2://")
    assert args["--artifacts-destination"].startswith("s3://")
    assert args["--app-name"] == "basic-auth" and args["--allowed-hosts"]
    env = {item["name"]: item for item in container["env"]}
    for name in ("PGPASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
    ini = next(doc for doc in by_kind["ConfigMap"])["data"]["basic_auth.ini"]
    assert "admin_password" not in ini and "database_uri = postgresql" in ini
    postgres = by_kind["StatefulSet"][0]
    pg_env = {item["name"]: item for item in _containers(postgres["spec"]["template"])[0]["env"]}
    assert "secretKeyRef" in pg_env["POSTGRES_PASSWORD"]["valueFrom"]
    # every Secret the manifests reference is one the README tells how to create
    readme = (INFRA / "README.md").read_text()
    referenced = {value for text in (MLFLOW.read_text(), RAYJOB.read_text())
                  for value in re.findall(r"name: (npsemiseg-[a-z0-9-]+)\b", text)
                  if value.startswith(("npsemiseg-postgres", "npsemiseg-mlflow", "npsemiseg-s3", "npsemiseg-ray-token"))}
    assert referenced and all(f"kubectl -n npsemiseg create secret generic {name}" in readme for name in referenced)


def test_infra_readme_and_cluster_doc_name_the_files():
    readme = (INFRA / "README.md").read_text()
    for path in (CLUSTER, RAYJOB, MLFLOW, DOCKERFILE):
        assert str(path.relative_to(ROOT)) in readme
    cluster_section = (ROOT / "README.md").read_text().split("## Cluster", 1)[1].split("\n## ", 1)[0]
    assert "npsemiseg stack up" in cluster_section and "infra/README.md" in cluster_section


# ----------------------------------------------------------------------------- datasets on every node
def test_gpu_workers_get_the_datasets_by_s3_staging_or_a_shared_volume():
    """S3 staging is wired (root, cache on the node's disk, mounted); the shared-volume option is shown, commented."""
    from semiseg_platform.data_staging import DATA_CACHE_ENV, is_remote

    cluster = yaml.safe_load(CLUSTER.read_text())
    for start in (" ".join(cluster["head_start_ray_commands"]), " ".join(cluster["worker_start_ray_commands"])):
        env = dict(word.split("=", 1) for word in shlex.split(start.replace(";", " ")) if re.match(r"^[A-Z_]+=", word))
        assert is_remote(env["NPSEMISEG_DATA"]) and env[DATA_CACHE_ENV].startswith("/")
        cache = env[DATA_CACHE_ENV]
    assert any(f"{cache}:{cache}" in option for option in cluster["docker"]["run_options"])  # on the host's disk
    assert any(cache in command and "chown 1000" in command for command in cluster["initialization_commands"])
    text = CLUSTER.read_text()
    assert "# - --volume /mnt/efs/datasets:/data:ro" in text and "mount -t nfs4" in text and "NPSEMISEG_DATA=/data" in text

    documents = _documents(RAYJOB)
    config = next(doc for doc in documents if doc["kind"] == "ConfigMap")["data"]
    assert is_remote(config["NPSEMISEG_DATA"])
    job = next(doc for doc in documents if doc["kind"] == "RayJob")
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        container = _containers(group["template"])[0]
        assert {"configMapRef": {"name": "npsemiseg-client"}} in container["envFrom"]
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        volume = next(v for v in pod["volumes"] if v["name"] == mounts[config[DATA_CACHE_ENV]])
        assert "emptyDir" in volume and "medium" not in volume["emptyDir"]  # the node's disk, not its memory
    text = RAYJOB.read_text()
    assert "persistentVolumeClaim: {claimName: npsemiseg-datasets, readOnly: true}" in text
    assert "# NPSEMISEG_DATA: /data" in text


# ----------------------------------------------------------------------------- fake autoscaling cluster
def test_fake_autoscaling_config_follows_the_cluster_launchers_node_types():
    """The local autoscaling test's node types come from cluster.yaml: same worker types and limits,
    GPUs as the ``gpu_standin`` custom resource, the head as the fake provider's head type."""
    from semiseg_platform.devstack.fake_cluster import (
        FAKE_HEAD_TYPE,
        FAKE_PROVIDER,
        GPU_STANDIN,
        fake_autoscaling_config,
        head_resources,
    )

    cluster = yaml.safe_load(CLUSTER.read_text())
    fake = fake_autoscaling_config(cluster, gcs_address="10.0.0.1:6379")
    real_types = {name: spec for name, spec in cluster["available_node_types"].items()
                  if name != cluster["head_node_type"]}
    assert fake["head_node_type"] == FAKE_HEAD_TYPE and fake["available_node_types"][FAKE_HEAD_TYPE]["max_workers"] == 0
    assert set(fake["available_node_types"]) - {FAKE_HEAD_TYPE} == set(real_types)
    for name, spec in real_types.items():
        faked = fake["available_node_types"][name]
        assert (faked["min_workers"], faked["max_workers"]) == (spec["min_workers"], spec["max_workers"])
        assert faked["resources"]["CPU"] == spec["resources"]["CPU"]
        assert faked["resources"][GPU_STANDIN] == spec["resources"]["GPU"] and "GPU" not in faked["resources"]
        assert faked["node_config"] == {}
    assert (fake["max_workers"], fake["idle_timeout_minutes"]) == (cluster["max_workers"], cluster["idle_timeout_minutes"])
    provider = fake["provider"]
    assert provider["type"] == "external" and provider["module"] == FAKE_PROVIDER
    assert provider["gcs_address"] == "10.0.0.1:6379" and provider["use_node_id_as_ip"] is True
    assert provider["disable_node_updaters"] is True
    assert head_resources(cluster) == {"CPU": cluster["available_node_types"]["head"]["resources"]["CPU"]}
    # a test's shrunk cluster: a cap on the node counts, fewer CPUs per node, a short idle timeout
    small = fake_autoscaling_config(cluster, gcs_address="h:1", max_workers=2, cpus=2, idle_timeout_minutes=0.1)
    assert small["max_workers"] == 2 and small["idle_timeout_minutes"] == 0.1
    assert all(spec["max_workers"] <= 2 and spec["resources"]["CPU"] == 2
               for name, spec in small["available_node_types"].items() if name != FAKE_HEAD_TYPE)
    # the provider class exists in the installed Ray
    import importlib

    module, _, name = FAKE_PROVIDER.rpartition(".")
    assert hasattr(importlib.import_module(module), name)

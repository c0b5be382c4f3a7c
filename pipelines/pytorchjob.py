"""Multi-node training as a Kubeflow Training Operator ``PyTorchJob`` (kubeflow.org/v1).

The train component launches one when ``platform.train_nodes > 1``: ``train_nodes`` pods (one
Master, the rest Workers), each with ``train_gpus`` GPUs, each running ``torchrun`` over
``trace-rl train`` (DeepSpeed ZeRO joins the process group torchrun sets up; the Training
Operator fills in ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``). Every pod mounts
the checkpoints volume at the workspace, where the component put the config, data, index and
warm-start policy, and where the job leaves ``summary.json`` and ``policy/``.

It cannot run here (no cluster). What is checked offline (``tests/test_pipeline.py`` and
``python -m pipelines compile``): the manifest validates against the PyTorchJob schema bundled in
``infra/training-operator/`` (generated from the ``kubeflow-training`` SDK's OpenAPI models; see
its README) and each pod template validates strictly against Kubernetes' own PodTemplateSpec
schema (``kubernetes-validate``).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA_FILE = REPO / "infra" / "training-operator" / "pytorchjob.schema.json"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes infra/ supports


def pytorchjob_manifest(
    name: str,
    image: str,
    config_path: str,
    nodes: int,
    gpus_per_node: int,
    *,
    namespace: str = "trace-rl",
    workspace_mount: str = "/workspace",
    checkpoints_pvc: str = "trace-rl-checkpoints",
    accelerator_type: str = "nvidia.com/gpu",
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    cpu: str = "8",
    memory: str = "64Gi",
    service_account: str = "trace-rl-pipeline",
    env: dict[str, str] | None = None,
    config_map: str | None = "trace-rl-pipeline-defaults",
) -> dict[str, Any]:
    """The PyTorchJob that trains ``config_path`` (a TrainConfig YAML on the shared volume)."""
    if nodes < 2:
        raise ValueError(f"nodes must be >= 2 for a multi-node job (one pod trains in the train step), got {nodes}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if not config_path.startswith(workspace_mount.rstrip("/") + "/"):
        raise ValueError(f"config_path {config_path} must lie on the shared volume under {workspace_mount}")
    command = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpus_per_node}",
               "-m", "trace_core.cli", "train", "--config", config_path]
    container: dict[str, Any] = {
        "name": "pytorch",  # the Training Operator finds the training container by this name
        "image": image,
        "command": ["sh", "-c", "exec " + shlex.join(command)],
        "env": [{"name": k, "value": v} for k, v in sorted((env or {}).items())],
        "resources": {
            "requests": {"cpu": cpu, "memory": memory, accelerator_type: str(gpus_per_node)},
            "limits": {"memory": memory, accelerator_type: str(gpus_per_node)},
        },
        "volumeMounts": [{"name": "workspace", "mountPath": workspace_mount},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if config_map:
        container["envFrom"] = [{"configMapRef": {"name": config_map}}]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "restartPolicy": "OnFailure",
        "containers": [container],
        "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": checkpoints_pvc}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]

    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "trace-rl"}},
                             "spec": json.loads(json.dumps(pod_spec))}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "trace-rl"}},
        "spec": {
            "nprocPerNode": str(gpus_per_node),
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 2, "ttlSecondsAfterFinished": 86400},
            "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(nodes - 1)},
        },
    }


def schema_errors(manifest: dict[str, Any], schema_file: Path = SCHEMA_FILE) -> list[str]:
    """Every way ``manifest`` breaks the bundled PyTorchJob schema or, for its pod templates,
    Kubernetes' strict PodTemplateSpec schema; one line each (empty: valid)."""
    import jsonschema

    schema = json.loads(schema_file.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
              for e in validator.iter_errors(manifest)]
    specs = manifest.get("spec", {}).get("pytorchReplicaSpecs", {})
    for role, spec in (specs.items() if isinstance(specs, dict) else []):
        template = spec.get("template") if isinstance(spec, dict) else None
        if isinstance(template, dict):
            errors += [f"spec.pytorchReplicaSpecs.{role}.template.{e}" for e in _pod_template_errors(template)]
    return errors


def _pod_template_errors(template: dict[str, Any]) -> list[str]:
    import kubernetes_validate

    doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in list(e.path)[1:])  # drop the wrapper's "template"
        return [f"{path}: {e.message}"]
    return []


def run_pytorchjob(manifest: dict[str, Any], poll_s: float = 30.0, timeout_s: float = 7 * 86400) -> dict[str, Any]:
    """Create the job in the cluster this pod runs in and wait until it succeeds (or raise)."""
    from kubernetes import client, config

    errors = schema_errors(manifest)
    if errors:
        raise ValueError("the PyTorchJob manifest is invalid:\n" + "\n".join(errors))
    config.load_incluster_config()
    api = client.CustomObjectsApi()
    meta = manifest["metadata"]
    api.create_namespaced_custom_object("kubeflow.org", "v1", meta["namespace"], "pytorchjobs", manifest)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = api.get_namespaced_custom_object("kubeflow.org", "v1", meta["namespace"], "pytorchjobs", meta["name"])
        conditions = {c["type"]: c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}
        if "Succeeded" in conditions:
            return job
        if "Failed" in conditions:
            raise RuntimeError(f"PyTorchJob {meta['name']} failed: {conditions['Failed'].get('message', '')}")
        time.sleep(poll_s)
    raise TimeoutError(f"PyTorchJob {meta['name']} did not finish in {timeout_s} s")

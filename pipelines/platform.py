"""Kubernetes placement of the pipeline's steps (kfp-kubernetes), from ``PipelineConfig.platform``.

Every step: the pinned CPU image, CPU/memory, the checkpoints volume at the workspace mount (the
reuse cache and checkpoints survive runs), the ConfigMap ``trace-rl-pipeline-defaults`` as
environment (MLflow URI, DVC remote), the optional ``mlflow-client`` Secret
(``MLFLOW_TRACKING_USERNAME``/``_PASSWORD`` for a server behind basic auth) and a part-of label.

* prepare_data: also the datasets volume at ``/data`` and the ``dvc-remote`` Secret as
  ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (``dvc pull`` from S3/MinIO).
* train: with ``train_gpus > 0`` the CUDA image, that many GPUs, the GPU node selector and
  tolerations, the training CPU/memory. With ``train_nodes > 1`` the step only launches and
  follows a Training Operator PyTorchJob (whose pods get the GPUs), so it stays a small CPU pod.
* evaluate: one GPU and the CUDA image when training has GPUs.
* warm_start and register read the registry's state, which is not among their inputs: KFP's
  cache is off for them.
"""

from __future__ import annotations

from typing import Any

from kfp import kubernetes

from pipelines.config import PlatformConfig

CONFIG_MAP_ENV = ("MLFLOW_TRACKING_URI", "DVC_REMOTE_URL", "DVC_S3_ENDPOINT_URL", "SANDBOX_POD_TEMPLATE")
PART_OF = ("app.kubernetes.io/part-of", "trace-rl")


def image(name: str) -> str:
    """The pinned reference of an ``infra/images`` entry (read from the images file itself: the
    placement needs no component)."""
    from infra.build_images import load_images

    images = load_images()  # the same mapping the components pin their images from
    if name not in images:
        raise ValueError(f"image {name!r} is not pinned in infra/images/kustomization.yaml ({sorted(images)})")
    return images[name]


def _common(task: Any, plat: PlatformConfig, cpu: str, memory: str) -> None:
    task.set_cpu_request(cpu).set_memory_limit(memory)
    kubernetes.mount_pvc(task, pvc_name=plat.checkpoints_pvc, mount_path=plat.workspace_mount)
    kubernetes.use_config_map_as_env(task, plat.config_map, {k: k for k in CONFIG_MAP_ENV})
    kubernetes.use_secret_as_env(task, plat.mlflow_secret, {"MLFLOW_TRACKING_USERNAME": "MLFLOW_TRACKING_USERNAME",
                                                            "MLFLOW_TRACKING_PASSWORD": "MLFLOW_TRACKING_PASSWORD"},
                                 optional=True)
    kubernetes.add_pod_label(task, *PART_OF)


def _gpu(task: Any, plat: PlatformConfig, count: int) -> None:
    task.set_container_image(image(plat.gpu_image))
    task.set_accelerator_type(plat.accelerator_type).set_accelerator_limit(count)
    for key, value in plat.train_node_selector.items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for tol in plat.train_tolerations:
        kubernetes.add_toleration(task, key=tol.get("key"), operator=tol.get("operator", "Equal"),
                                  value=tol.get("value"), effect=tol.get("effect"))


def apply(steps: dict[str, list[Any]], plat: PlatformConfig) -> None:
    """Apply the placement to the tasks grouped by role: ``cpu`` (prepare, index, warm start),
    ``train``, ``evaluate`` and ``light`` (profile, register, compare)."""
    for task in steps["cpu"] + steps["light"]:
        _common(task, plat, plat.step_cpu, plat.step_memory)
    prepare = steps["cpu"][0]
    kubernetes.mount_pvc(prepare, pvc_name=plat.datasets_pvc, mount_path="/data")
    kubernetes.use_secret_as_env(prepare, plat.dvc_secret, {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
                                                            "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"})
    for task in steps["cpu"][2:] + steps["light"]:
        if task.component_spec.name in ("warm-start", "register"):
            task.set_caching_options(False)
    multi_node = plat.train_nodes > 1
    for task in steps["train"]:
        if multi_node:  # the PyTorchJob's pods train; this pod launches and follows it
            _common(task, plat, plat.step_cpu, plat.step_memory)
            task.set_env_variable("TRACE_RL_TRAIN_IMAGE", image(plat.gpu_image))
        else:
            _common(task, plat, plat.train_cpu, plat.train_memory)
            if plat.train_gpus > 0:
                _gpu(task, plat, plat.train_gpus)
                kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    for task in steps["evaluate"]:
        _common(task, plat, plat.train_cpu, plat.train_memory)
        if plat.train_gpus > 0:
            _gpu(task, plat, 1)

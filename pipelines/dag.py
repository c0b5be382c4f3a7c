"""The DAG. It reads as the method's experiment:

    prepare_data → build_retriever_index → warm_start
        → for each method, in parallel:  train → evaluate → profile   (+ register, for registry.method)
        → compare

Pipeline parameters are the sections of :class:`~pipelines.config.PipelineConfig` as JSON strings
(``train_config`` is the trainer's TrainConfig), the method list, the workspace and the MLflow
target; their defaults are the configuration the pipeline was built from, and a run can override
any of them. Kubernetes placement (images, GPUs, node selectors, tolerations, volumes, secrets) is
applied at build time from ``platform`` (:mod:`pipelines.platform`); ``kfp.local`` ignores it.

The steps are the components' compiled specs (``components/specs/``, :func:`load_component`), not
their Python functions: the components import ``pipelines.steps``, and nothing here imports a
component, so the dependency runs one way.
"""

# No `from __future__ import annotations`: KFP reads the pipeline function's annotations as types.
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kfp import dsl

from pipelines.config import PipelineConfig, section_json

PIPELINE_NAME = "trace-rl"
SPECS = Path(__file__).resolve().parents[1] / "components" / "specs"  # the compiled components (data, not code)


def build_pipeline(cfg: PipelineConfig, platform: bool = True, parallelism: int = 0) -> Callable[..., Any]:
    """The pipeline function for ``cfg`` (its parameters default to ``cfg``'s sections).

    ``platform``: apply ``cfg.platform``'s Kubernetes settings (for compile/submit/schedule).
    ``parallelism``: methods trained at once (0: all; the local runner uses 1)."""
    from pipelines import platform as placement

    prepare_data, build_retriever_index, warm_start, train, evaluate, profile, register, compare = (
        load_component(name) for name in ("prepare_data", "build_retriever_index", "warm_start", "train", "evaluate",
                                          "profile", "register", "compare"))

    plat = cfg.platform
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    register_enabled = cfg.registry.enabled
    # The machine the steps run on: the cluster's placement, or this machine (no GPUs, one node).
    gpus, nodes = (plat.train_gpus, plat.train_nodes) if platform else (0, 1)

    @dsl.pipeline(name=PIPELINE_NAME, description="TRACE vs baselines: prepare data, index, warm start, train each "
                  "method, evaluate, profile, compare; the registry keeps the champion policy.")
    def trace_rl(
        methods: list[str] = list(cfg.methods),  # noqa: B006 — KFP reads the default from here
        register_method: str = cfg.registry.method,
        workspace: str = cfg.workspace,
        reuse: bool = cfg.reuse,
        mlflow_uri: str = cfg.train.tracking.tracking_uri,
        mlflow_experiment: str = cfg.train.tracking.experiment,
        data_config: str = section_json(cfg.data),
        index_config: str = section_json(cfg.index),
        warm_start_config: str = section_json(cfg.warm_start),
        train_config: str = section_json(cfg.train),
        eval_config: str = section_json(cfg.evaluate),
        registry_config: str = section_json(cfg.registry),
        platform_config: str = section_json(cfg.platform),
    ) -> str:
        common = {"workspace": workspace, "reuse": reuse, "tracking_uri": mlflow_uri, "experiment": mlflow_experiment}
        data = prepare_data(data_config=data_config, kfp_run_id=run_id, **common)
        data.set_display_name("prepare data (DVC + Great Expectations)")
        index = build_retriever_index(data=data.outputs["data"], index_config=index_config, kfp_run_id=run_id,
                                      **common)
        index.set_display_name("build retriever index")
        warm = warm_start(data=data.outputs["data"], index=index.outputs["index"],
                          warm_start_config=warm_start_config, agent_config=_agent_json(cfg),
                          registry_config=registry_config, kfp_run_id=run_id, **common)
        warm.set_display_name("warm start")
        steps: dict[str, list[Any]] = {"cpu": [data, index, warm], "train": [], "evaluate": [], "light": []}
        with dsl.ParallelFor(methods, parallelism=parallelism, name="methods") as method:
            trained = train(method=method, data=data.outputs["data"], index=index.outputs["index"],
                            warm_policy=warm.outputs["policy"], testbed=warm.outputs["testbed"],
                            train_config=train_config, gpus=gpus, nodes=nodes,
                            platform_config=platform_config, kfp_run_id=run_id, **common)
            trained.set_display_name("train")
            evaluated = evaluate(trained=trained.outputs["trained"], data=data.outputs["data"],
                                 index=index.outputs["index"], eval_config=eval_config, train_config=train_config,
                                 **common)
            evaluated.set_display_name("evaluate")
            profiled = profile(trained=trained.outputs["trained"], evaluation=evaluated.outputs["result"],
                               tracking_uri=mlflow_uri, experiment=mlflow_experiment, workspace=workspace)
            profiled.set_display_name("profile (cost breakdown)")
            steps["train"].append(trained)
            steps["evaluate"].append(evaluated)
            steps["light"].append(profiled)
            if register_enabled:
                with dsl.If(method == register_method, name="registry-method"):
                    registered = register(trained=trained.outputs["trained"], evaluation=evaluated.outputs["result"],
                                          registry_config=registry_config, tracking_uri=mlflow_uri,
                                          kfp_run_id=run_id)
                    registered.set_display_name("register (promote if better)")
                    steps["light"].append(registered)
        compared = compare(reports=dsl.Collected(profiled.outputs["report"]), methods=methods,
                           kfp_run_id=run_id, **common)
        compared.set_display_name("compare")
        steps["light"].append(compared)
        if platform:
            placement.apply(steps, plat)
        return compared.outputs["Output"]

    return trace_rl


def load_component(name: str) -> Any:
    """Component ``name`` from its compiled spec, ``components/specs/<name>.yaml`` (written by
    ``python -m components.specs`` from the component function, and checked against it by a
    test): the DAG reads the components as KFP does, so this package never imports them."""
    from kfp import components

    path = SPECS / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no compiled spec for component {name!r} at {path}: run `python -m components.specs`")
    return components.load_component_from_file(str(path))


def _agent_json(cfg: PipelineConfig) -> str:
    return section_json(cfg.train.agent)


def compile_pipeline(cfg: PipelineConfig, path: str) -> str:
    """Compile the pipeline (with Kubernetes placement) to a YAML package at ``path``."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(cfg, platform=True), package_path=path)
    return path

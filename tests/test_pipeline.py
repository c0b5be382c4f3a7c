"""The Kubeflow pipeline: the compiled YAML (components, edges, resources, secrets), the multi-node
PyTorchJob against its schema, params.yaml against the config, the model registry's promotion
rule, a miniature local run (kfp.local) into a real MLflow server (reuse on a second run: the main
command's measurement and test_components' prepare_data test), the MLflow UI's compare view in
Debian's chromium, and `dvc repro` with miniature parameters in a temporary clone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # components/ and pipelines/ live at the repository root
    sys.path.insert(0, str(REPO))

from pipelines.config import PipelineConfig  # noqa: E402

COMPONENTS = {"prepare-data", "build-retriever-index", "warm-start", "train", "evaluate", "profile", "register",
              "compare"}
# Small enough for a test, large enough to exercise every path: both methods train one step and
# are evaluated on a few examples; the transformers engine (no vLLM start-up).
MINIATURE = [
    "methods=[grpo,trace]", "warm_start.testbed_pool=16", "warm_start.epochs=1", "warm_start.batch_size=6",
    "train.predictor_warmup.samples=2", "train.predictor_warmup.updates=2",
    "train.steps=1", "train.engine.kind=hf", "train.budget.roots_M=4", "train.budget.expansion_N=1",
    "train.budget.group_size_G=2", "train.budget.max_per_prompt=4", "train.budget.pool_factor=1",
    "train.agent.max_new_tokens=16", "train.policy.micro_batches=1",
    "evaluate.max_examples=3", "evaluate.samples=2",
]


def compiled(tmp_path: Path, *overrides: str) -> tuple[dict, dict]:
    from pipelines.__main__ import main

    out = tmp_path / "pipeline.yaml"
    assert main(["compile", "-o", str(out), *overrides]) == 0
    spec, platform = list(yaml.safe_load_all(out.read_text()))
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def all_tasks(spec: dict) -> dict[str, dict]:
    tasks = dict(spec["root"]["dag"]["tasks"])
    for comp in spec["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return tasks


def producers(task: dict) -> set[str]:
    """Upstream tasks of a task's artifact inputs (through a loop's inputs: the parent DAG's channel)."""
    out = set()
    for art in task.get("inputs", {}).get("artifacts", {}).values():
        if "taskOutputArtifact" in art:
            out.add(art["taskOutputArtifact"]["producerTask"])
        elif "componentInputArtifact" in art:
            out.add(art["componentInputArtifact"].split("--", 1)[1].rsplit("-", 1)[0])
    return out


# ------------------------------------------------------------------------------------ compiled YAML
def test_compiled_pipeline_has_every_component_edge_resource_and_secret(tmp_path: Path) -> None:
    from components import IMAGES

    spec, executors = compiled(tmp_path)
    tasks = all_tasks(spec)
    assert COMPONENTS <= set(tasks)
    assert {f"exec-{c}" for c in COMPONENTS} == set(spec["deploymentSpec"]["executors"])
    # Edges: the DAG prepare -> index -> warm start -> (train -> evaluate -> profile, register) -> compare.
    assert producers(tasks["build-retriever-index"]) == {"prepare-data"}
    assert producers(tasks["warm-start"]) == {"prepare-data", "build-retriever-index"}
    assert producers(tasks["train"]) == {"prepare-data", "build-retriever-index", "warm-start"}
    assert producers(tasks["evaluate"]) == {"train", "prepare-data", "build-retriever-index"}
    assert producers(tasks["profile"]) == {"train", "evaluate"}
    assert producers(tasks["register"]) == {"train", "evaluate"}
    assert tasks["compare"]["dependentTasks"] == ["for-loop-1"]
    assert tasks["compare"]["inputs"]["artifacts"]["reports"]["taskOutputArtifact"]["producerTask"] == "for-loop-1"
    loop = spec["root"]["dag"]["tasks"]["for-loop-1"]
    assert loop["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--methods"
    assert "register_method" in tasks["condition-2"]["triggerPolicy"]["condition"]
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["methods"]["defaultValue"] == ["grpo", "pcl", "trace"]
    assert json.loads(defaults["train_config"]["defaultValue"])["budget"]["roots_M"] == 32
    assert defaults["mlflow_uri"]["defaultValue"] == "http://mlflow:5000"  # compile targets the cluster
    assert defaults["workspace"]["defaultValue"] == "/workspace"
    # Resources and images: GPU steps on the CUDA image, the rest on the CPU image (pinned in infra/).
    containers = {k[len("exec-"):]: v["container"] for k, v in spec["deploymentSpec"]["executors"].items()}
    for name in ("train", "evaluate"):
        assert containers[name]["image"] == IMAGES["trace-rl-cuda"]
        assert containers[name]["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert containers[name]["resources"]["resourceCpuRequest"] == "8"
        assert containers[name]["resources"]["resourceMemoryLimit"] == "64Gi"
    assert containers["train"]["resources"]["accelerator"]["resourceCount"] == "1"
    for name in COMPONENTS - {"train", "evaluate"}:
        assert containers[name]["image"] == IMAGES["trace-rl-cpu"]
        assert "accelerator" not in containers[name]["resources"]
    # kfp-kubernetes: volumes, secrets, ConfigMap, placement.
    for name in COMPONENTS:
        k8s = executors[f"exec-{name}"]
        assert {m["mountPath"]: m["constant"] for m in k8s["pvcMount"]}["/workspace"] == "trace-rl-checkpoints"
        mlflow = {s["secretName"]: s for s in k8s["secretAsEnv"]}["mlflow-client"]
        assert mlflow["optional"] is True
        assert k8s["configMapAsEnv"][0]["configMapName"] == "trace-rl-pipeline-defaults"
    prepare = executors["exec-prepare-data"]
    dvc = {s["secretName"]: s for s in prepare["secretAsEnv"]}["dvc-remote"]
    assert {e["envVar"] for e in dvc["keyToEnv"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert {m["mountPath"]: m["constant"] for m in prepare["pvcMount"]}["/data"] == "trace-rl-datasets"
    for name in ("train", "evaluate"):
        k8s = executors[f"exec-{name}"]
        assert k8s["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}
        assert k8s["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    assert "nodeSelector" not in executors["exec-prepare-data"]
    # The registry's state is not an input: KFP must not cache the steps that read it.
    assert not tasks["warm-start"].get("cachingOptions", {}).get("enableCache", False)
    assert not tasks["register"].get("cachingOptions", {}).get("enableCache", False)
    assert tasks["train"]["cachingOptions"]["enableCache"] is True


def test_multi_node_training_compiles_to_a_launcher_step(tmp_path: Path) -> None:
    spec, executors = compiled(tmp_path, "platform.train_nodes=3", "platform.train_gpus=8")
    train = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert "accelerator" not in train["resources"]  # the PyTorchJob's pods hold the GPUs
    assert {e["name"] for e in train.get("env", [])} >= {"TRACE_RL_TRAIN_IMAGE"}
    spec, _ = compiled(tmp_path, "platform.train_gpus=0")
    train = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert "accelerator" not in train["resources"] and train["image"].endswith("-cpu")


def test_pytorchjob_manifest_validates_against_the_training_operator_schema(tmp_path: Path) -> None:
    from pipelines.__main__ import main
    from pipelines.pytorchjob import pytorchjob_manifest, schema_errors

    path = tmp_path / "pytorchjob.yaml"
    assert main(["compile", "-o", str(tmp_path / "p.yaml"), "--pytorchjob", str(path), "platform.train_nodes=4",
                 "platform.train_gpus=8"]) == 0
    job = yaml.safe_load(path.read_text())
    assert schema_errors(job) == []
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--nnodes=4" in pod["containers"][0]["command"][-1]
    broken = json.loads(json.dumps(job))
    broken["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"  # not a CleanPodPolicy
    broken["spec"]["pytorchReplicaSpecs"]["Chief"] = broken["spec"]["pytorchReplicaSpecs"].pop("Worker")
    del broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"]
    broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["gpus"] = 8
    errors = "\n".join(schema_errors(broken))
    assert "cleanPodPolicy" in errors and "'Chief' is not one of" in errors and "'gpus' was unexpected" in errors
    with pytest.raises(ValueError, match="nodes must be >= 2"):
        pytorchjob_manifest("x", "img:1", "/workspace/c.yaml", 1, 1)
    with pytest.raises(ValueError, match="shared volume"):
        pytorchjob_manifest("x", "img:1", "/tmp/c.yaml", 2, 1)


# ------------------------------------------------------------------------------------ config files
def test_params_yaml_is_the_config_written_out() -> None:
    from pipelines.__main__ import params_text
    from trace_core.config import from_dict, to_dict
    from trace_core.training.config import TrainConfig

    text = (REPO / "params.yaml").read_text()
    assert text == params_text(PipelineConfig()), "params.yaml is stale: run `python -m pipelines params`"
    params = yaml.safe_load(text)
    assert "/" not in str(params["train"]["task"]["envs"]["math"]["sandbox"].get("python", ""))  # no local paths
    from trace_core.config import load_config

    loaded = load_config(PipelineConfig, REPO / "params.yaml")  # strict: every key is a field
    assert to_dict(loaded) == to_dict(PipelineConfig())
    assert to_dict(loaded.train) == to_dict(from_dict(TrainConfig, to_dict(loaded.train)))


def test_the_testbed_seed_setting_redraws_the_testbed_the_warm_start_builds() -> None:
    from dataclasses import asdict

    from conftest import DATA

    from pipelines.steps.warm_start import sft_config
    from trace_core.config import load_config
    from trace_core.warmstart.testbed import draw_testbed, read_rows

    def bed(overrides):
        cfg = load_config(PipelineConfig, None, overrides)
        ws = sft_config("data", "index", asdict(cfg.warm_start), asdict(cfg.train.agent), "out")
        return ws.testbed

    first, second = bed([]), bed(["warm_start.testbed_seed=1"])
    assert (first.seed, second.seed) == (0, 1) and first.pool_size == second.pool_size == 128
    rows, md5 = read_rows(DATA / "qa" / "train.jsonl")
    pools = [set(draw_testbed(rows, config, md5).pool) for config in (first, second)]
    assert pools[0] != pools[1]  # another pool of questions, not only another label


def test_dvc_yaml_mirrors_the_dag_and_the_params() -> None:
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    stages = dvc["stages"]
    assert list(stages) == ["prepare_data", "build_retriever_index", "warm_start", "train", "evaluate", "profile",
                            "compare"]
    for name in ("train", "evaluate", "profile"):
        assert stages[name]["foreach"] == "${methods}"
    assert "runs/dvc/profile" in stages["compare"]["deps"]  # every method's profile@<method> output
    for name in ("evaluate", "profile"):
        assert any("${item}" in d for d in stages[name]["do"]["deps"])
    for stage in stages.values():
        body = stage.get("do", stage)
        for p in body.get("params", []):
            node = params
            for part in p.split("."):
                node = node[part]  # every declared param exists
        assert body["cmd"].startswith("python -m pipelines stage ")
    assert "runs/dvc/compare/metrics.json" in str(stages["compare"]["metrics"])
    assert "runs/dvc/compare/effective_ratio.csv" in str(stages["compare"]["plots"])
    config = (REPO / ".dvc" / "config").read_text()
    assert "remote = local" in config and "../.dvc-remote" in config
    assert "/.dvc-remote/" in (REPO / ".gitignore").read_text()


def test_every_entry_point_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.__main__ import main

    for command in ("compile", "run", "submit", "schedule", "params", "stage"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert f"python -m pipelines {command}" in capsys.readouterr().out


def test_bad_settings_are_refused() -> None:
    from trace_core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="not in the registry"):
        load_config(PipelineConfig, None, ["methods=[grpo,nope]"])
    with pytest.raises(ConfigError, match="registry.method"):
        load_config(PipelineConfig, None, ["methods=[grpo]"])
    with pytest.raises(ConfigError, match="warm_start.families"):
        load_config(PipelineConfig, None, ["train.task.family=math"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(PipelineConfig, None, ["train.stepz=3"])


# ------------------------------------------------------------------------------------ registry
def _policy(path: Path, marker: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"marker": marker}))
    return path


def _run(uri: str, name: str, tmp_path: Path) -> str:
    from trace_core.tracking import MLflowTracker, TrackingConfig

    tracker = MLflowTracker(TrackingConfig(tracking_uri=uri, experiment="registry-test", run_name=name,
                                           spool_dir=str(tmp_path / f"spool-{name}")))
    tracker.log_metrics({"eval/score": 0.0}, step=0)
    tracker.close()
    return tracker.run_id


def test_a_worse_retrain_is_registered_but_not_promoted(server, tmp_path: Path) -> None:
    from pipelines.registry import champion, download_policy, register_policy, starting_point

    name = "policy-registry-test"
    assert champion(server.uri, name) is None and starting_point(server.uri, name) is None
    first = register_policy(server.uri, name, _run(server.uri, "first", tmp_path), _policy(tmp_path / "p1", "first"),
                            score=0.5, metric="pass_at_1", fingerprint="fp-1")
    assert first.promoted and first.version == "1" and first.champion_score is None
    worse = register_policy(server.uri, name, _run(server.uri, "worse", tmp_path), _policy(tmp_path / "p2", "worse"),
                            score=0.25, metric="pass_at_1", fingerprint="fp-2")
    assert worse.version == "2" and not worse.promoted and worse.champion_score == 0.5
    best = champion(server.uri, name)
    assert best.version == "1" and best.tags["promoted"] == "true"
    again = register_policy(server.uri, name, worse.run_id, tmp_path / "p2", score=0.25, metric="pass_at_1",
                            fingerprint="fp-2")
    assert again.reused and again.version == "2" and not again.promoted  # the same result: nothing new
    tie = register_policy(server.uri, name, _run(server.uri, "tie", tmp_path), _policy(tmp_path / "p3", "tie"),
                          score=0.5, metric="pass_at_1", fingerprint="fp-3")
    assert not tie.promoted  # a tie keeps the champion
    better = register_policy(server.uri, name, _run(server.uri, "better", tmp_path),
                             _policy(tmp_path / "p4", "better"), score=0.75, metric="pass_at_1", fingerprint="fp-4")
    assert better.promoted and champion(server.uri, name).version == better.version == "4"
    start = starting_point(server.uri, name)  # a recurring retrain starts from the champion
    got = download_policy(server.uri, start, tmp_path / "download")
    assert json.loads((got / "config.json").read_text()) == {"marker": "better"}
    with pytest.raises(ValueError, match="finite"):
        register_policy(server.uri, name, better.run_id, tmp_path / "p4", score=float("nan"), metric="m",
                        fingerprint="x")
    with pytest.raises(ValueError, match="config.json"):
        register_policy(server.uri, name, better.run_id, tmp_path, score=0.1, metric="m", fingerprint="y")


# ------------------------------------------------------------------------------------ local run
@pytest.fixture(scope="module")
def local_run(server, tmp_path_factory):
    """The whole DAG on kfp.local with miniature settings, logging to a real MLflow server."""
    from pipelines.local import run_local
    from trace_core.config import load_config

    workspace = tmp_path_factory.mktemp("pipeline")
    cfg = load_config(PipelineConfig, None, [*MINIATURE, f"workspace={workspace}",
                                             f"train.tracking.tracking_uri={server.uri}"])
    return cfg, run_local(cfg, echo=False)


def test_miniature_local_pipeline_runs_end_to_end(local_run, server) -> None:
    from mlflow.tracking import MlflowClient

    from pipelines.lineage import LINEAGE_KEYS
    from pipelines.registry import champion

    cfg, first = local_run
    assert set(first.training_runs) == {"grpo", "trace"}
    assert "| grpo |" in first.table and "| trace |" in first.table and "### Evaluation" in first.table
    client = MlflowClient(server.uri)
    for method, run_id in first.training_runs.items():
        run = client.get_run(run_id)
        assert run.data.tags["method"] == method and run.info.status == "FINISHED"
        assert "effective_ratio" in run.data.metrics and "eval/score" in run.data.metrics
        assert "profile/rollout_share" in run.data.metrics
        assert set(LINEAGE_KEYS) <= set(run.data.tags), run.data.tags
        assert run.data.tags["lineage.dvc_data_hash"].endswith(".dir")
        kfp_run = run.data.tags["lineage.kfp_run_id"]
        assert kfp_run not in ("", "none") and "{{" not in kfp_run  # the placeholder was resolved
    steps = client.search_runs([first.experiment_id], filter_string="tags.`pipeline.step` = 'prepare_data'")
    assert steps and set(LINEAGE_KEYS) <= set(steps[0].data.tags)
    best = champion(server.uri, cfg.registry.model_name)
    assert best is not None and best.run_id == first.training_runs["trace"]
    train_runs = client.search_runs([first.experiment_id], filter_string="tags.`pipeline.step` = 'train'")
    assert len(train_runs) == 2


def _browser():
    """Headless chromium through selenium. Provisioned by `make system-deps`; a missing browser fails
    the test with the command to run, unless TRACE_RL_SKIP_BROWSER=1 asks to skip it."""
    missing = [tool for tool in ("chromium", "chromedriver") if shutil.which(tool) is None]
    if missing:
        if os.environ.get("TRACE_RL_SKIP_BROWSER") == "1":
            pytest.skip(f"TRACE_RL_SKIP_BROWSER=1 and {', '.join(missing)} missing")
        pytest.fail(f"{', '.join(missing)} not found: run `make system-deps` (apt-get install -y chromium "
                    "chromium-driver) or set TRACE_RL_SKIP_BROWSER=1 to skip the browser test")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1200"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(120)
    return driver


# The compare view's tables are virtualised: rows render only once scrolled into view.
_SCROLL_EVERY_PANE = """
for (const el of document.querySelectorAll('*')) {
  const style = getComputedStyle(el);
  if ((style.overflowY === 'auto' || style.overflowY === 'scroll') && el.scrollHeight > el.clientHeight + 5)
    el.scrollTop += 300;
}
window.scrollBy(0, 300);"""


def _lines_while_scrolling(driver, wanted: set[str], timeout_s: float = 120.0) -> set[str]:
    """Every line of page text seen while scrolling every pane down, until the text holds each of
    ``wanted`` (as a substring of some line) or ``timeout_s`` passes; restarts from the top each pass."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _ in range(40):
            seen.update(driver.find_element("tag name", "body").text.splitlines())
            if all(any(w in line for line in seen) for w in wanted):
                return seen
            driver.execute_script(_SCROLL_EVERY_PANE)
            time.sleep(0.25)
        driver.execute_script("for (const el of document.querySelectorAll('*')) el.scrollTop = 0;")
        time.sleep(1.0)
    return seen


def test_mlflow_ui_compare_view_shows_both_runs_their_signal_and_their_plots(local_run, server) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    from pipelines.local import compare_url

    _, first = local_run
    runs = {m: first.training_runs[m] for m in ("grpo", "trace")}
    driver = _browser()
    try:
        driver.get(compare_url(first.experiment_id, list(runs.values()), server.uri))
        wanted = {"grpo", "trace", "effective_ratio", "contrastive_yield", *runs.values()}
        seen = _lines_while_scrolling(driver, wanted)
        # Each run's plots, in its artifacts.
        listed = {}
        for method, run_id in runs.items():
            driver.get(f"{server.uri}/#/experiments/{first.experiment_id}/runs/{run_id}/artifacts")
            WebDriverWait(driver, 120, poll_frequency=1).until(
                lambda d: d.find_elements("xpath", "//*[text()='plots']"))
            driver.find_elements("xpath", "//*[text()='plots']")[0].click()
            WebDriverWait(driver, 60, poll_frequency=1).until(
                lambda d: "effective_ratio.png" in d.find_element("tag name", "body").text)
            listed[method] = driver.find_element("tag name", "body").text
    finally:
        driver.quit()
    # The compare view lists both runs (ids and names) and both learning-signal metrics.
    for word in wanted:
        assert any(word in line for line in seen), f"{word!r} not on the compare view"
    for method, text in listed.items():
        assert "effective_ratio.png" in text, f"{method}'s plots/ lacks effective_ratio.png"
    # Evaluation settings are logged under names every method's run shares (no method in the key).
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)
    for method, run_id in runs.items():
        params = client.get_run(run_id).data.params
        assert "eval/samples" in params, sorted(params)[:20]
        assert not any(k.startswith(f"eval/{m}/") for k in params for m in runs), method
        assert not any(k.startswith(("eval/agents.math", "eval/agents.fc")) for k in params)  # a QA run


# ------------------------------------------------------------------------------------ DVC
def test_dvc_repro_in_a_fresh_clone_then_nothing_to_do(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    # The working tree's pipeline files may be newer than the last commit: bring them over.
    for rel in ("dvc.yaml", "params.yaml", ".dvc/config", ".gitignore", "data.dvc", "components", "pipelines",
                "trace_core", "infra/images", "infra/build_images.py", "infra/training-operator"):
        src, dst = REPO / rel, clone / rel
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "PYTHONPATH": str(clone)}
    # One method keeps it short; the local-run test covers two.
    miniature = [*MINIATURE, "methods=[trace]", "train.tracking.tracking_uri=sqlite:///runs/mlflow.db"]
    subprocess.run([sys.executable, "-m", "pipelines", "params", *miniature], cwd=clone, env=env, check=True,
                   capture_output=True, timeout=120)

    def dvc(*args: str, timeout: int = 900) -> str:
        out = subprocess.run(["dvc", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"dvc {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out.stdout

    first = dvc("repro")
    for stage in ("prepare_data", "build_retriever_index", "warm_start", "train@trace", "evaluate@trace",
                  "profile@trace", "compare"):
        assert f"Running stage '{stage}'" in first, stage
    second = dvc("repro")
    assert "Running stage" not in second and "didn't change, skipping" in second
    metrics = json.loads(dvc("metrics", "show", "--json"))
    shown = json.dumps(metrics)
    assert "effective_ratio" in shown and "eval_score" in shown
    plots = dvc("plots", "show", "--json")
    assert "effective_ratio.csv" in plots
    assert (clone / "runs/dvc/compare/table.md").read_text().count("| trace |") == 3  # signal, cost, evaluation


def test_the_compare_stage_reads_histories_under_its_own_output_folder(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.stages import _compare_files

    out = tmp_path / "elsewhere"
    (out / "compare").mkdir(parents=True)
    for method, ratios in (("grpo", [0.25, 0.5]), ("trace", [0.5])):
        (out / "train" / method / "trained").mkdir(parents=True)
        (out / "train" / method / "trained" / "history.json").write_text(json.dumps({"effective_ratio": ratios}))
    monkeypatch.chdir(tmp_path)  # nothing under the default runs/dvc here
    reports = [{"score": 0.5, "means": {"effective_ratio": 0.375}, "cost_shares": {}},
               {"score": 0.25, "means": {"effective_ratio": 0.5}, "cost_shares": {}}]
    _compare_files(out, reports, ["grpo", "trace"])
    rows = (out / "compare" / "effective_ratio.csv").read_text().splitlines()
    assert rows == ["step,grpo,trace", "0,0.25,0.5", "1,0.5,"]
    assert json.loads((out / "compare" / "metrics.json").read_text())["trace"]["effective_ratio"] == 0.5


# ------------------------------------------------------------------------------------ submit / schedule
class _KFPApi:
    """A Kubeflow Pipelines REST endpoint (v2beta1) on a local port that records what it is sent:
    enough of the API for kfp.Client's submit and schedule calls (healthz, experiments, runs,
    recurring runs). It checks what *our* entry points send through the real kfp client."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[tuple[str, str, dict]] = []
        self.experiments: dict[str, dict] = {}
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def reply(self, body: dict, code: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                api.requests.append(("GET", self.path, {}))
                path = self.path.split("?")[0]
                if path.endswith("/healthz"):
                    return self.reply({"multi_user": False})
                if path.endswith("/experiments"):
                    return self.reply({"experiments": list(api.experiments.values())} if api.experiments else {})
                if "/experiments/" in path:
                    return self.reply(api.experiments[path.rsplit("/", 1)[1]])
                return self.reply({"error": f"unknown {path}"}, 404)

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                api.requests.append(("POST", self.path, body))
                path = self.path.split("?")[0]
                if path.endswith("/experiments"):
                    exp = {**body, "experiment_id": f"exp-{len(api.experiments) + 1}"}
                    api.experiments[exp["experiment_id"]] = exp
                    return self.reply(exp)
                if path.endswith("/runs"):
                    return self.reply({**body, "run_id": "run-1"})
                if path.endswith("/recurringruns"):
                    return self.reply({**body, "recurring_run_id": "recurring-1"})
                return self.reply({"error": f"unknown {path}"}, 404)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def posted(self, suffix: str) -> list[dict]:
        return [body for method, path, body in self.requests
                if method == "POST" and path.split("?")[0].endswith(suffix)]

    def close(self) -> None:
        self.server.shutdown()


def _parameters(body: dict) -> dict:
    """A run's or recurring run's parameters, whichever field name the client uses."""
    config = body.get("runtime_config") or body.get("runtimeConfig") or {}
    return config.get("parameters", {})


def test_submit_and_schedule_send_the_pipeline_its_parameters_and_the_schedule(tmp_path: Path,
                                                                                capsys) -> None:
    from pipelines.__main__ import main

    api = _KFPApi()
    try:
        assert main(["submit", "--host", api.url, "--experiment", "nightly", "--run-name", "first",
                     "--mlflow-uri", "http://mlflow.example:5000", "--output", str(tmp_path / "p.yaml"),
                     "methods=[grpo,treepo,trace]"]) == 0
        assert "submitted run run-1" in capsys.readouterr().out
        (run,) = api.posted("/runs")
        assert run["display_name"] == "first" and run["experiment_id"] == "exp-1"
        assert run["service_account"] == PipelineConfig().platform.service_account
        params = _parameters(run)
        assert params["methods"] == ["grpo", "treepo", "trace"] and params["mlflow_uri"] == "http://mlflow.example:5000"
        assert json.loads(params["train_config"])["tracking"]["tracking_uri"] == "http://mlflow.example:5000"
        sent = run["pipeline_spec"]  # the package's two documents: the pipeline and its Kubernetes placement
        spec, placement = sent["pipeline_spec"], sent["platform_spec"]
        assert "kubernetes" in placement["platforms"]
        assert spec["pipelineInfo"]["name"] == "trace-rl" and set(spec["deploymentSpec"]["executors"]) >= {
            "exec-train", "exec-evaluate", "exec-compare"}
        assert [e["display_name"] for e in api.posted("/experiments")] == ["nightly"]

        assert main(["schedule", "--host", api.url, "--experiment", "nightly", "--cron", "0 0 3 * * *",
                     "--output", str(tmp_path / "s.yaml")]) == 0
        (job,) = api.posted("/recurringruns")
        assert job["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *" and job["max_concurrency"] in (1, "1")
        assert job["no_catchup"] is True and job["experiment_id"] == "exp-1"  # the existing experiment, reused
        # A recurring retrain starts from the registry's champion and registers what it trains.
        warm = json.loads(_parameters(job)["warm_start_config"])
        assert warm["from_registry"] is True and json.loads(_parameters(job)["registry_config"])["enabled"] is True
        assert len(api.posted("/experiments")) == 1
    finally:
        api.close()


def test_the_dvc_stages_call_the_steps_and_reach_neither_kubeflow_nor_a_component() -> None:
    """``dvc.yaml``'s stages run ``pipelines.steps`` with their typed inputs: nothing they import,
    directly or through one another, is a component or imports kfp (no imitation KFP artifacts)."""
    import ast

    from pipelines.lineage import import_closure

    closure = import_closure("pipelines.stages", roots=("pipelines", "components", "trace_core"))
    assert not [m for m in closure if m.startswith("components")]
    assert {"pipelines.steps.train", "pipelines.steps.evaluate", "pipelines.steps.compare"} <= set(closure)

    def imports_kfp(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "kfp" or n.startswith("kfp.") for n in names):
                return True
        return False

    assert not [m for m, path in closure.items() if imports_kfp(path)]


def test_the_imports_between_pipelines_and_components_run_one_way() -> None:
    """The components call the steps, and no module of ``pipelines`` imports a component, not even
    inside a function: the DAG composes them from their compiled specs. Every component reaches
    a step."""
    import ast

    from pipelines.lineage import import_closure

    root = Path(__file__).resolve().parents[1]

    def direct_imports(path: Path) -> set[str]:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
        return found

    importers = sorted(
        ".".join(path.relative_to(root).with_suffix("").parts)
        for path in (root / "pipelines").rglob("*.py")
        if any(n == "components" or n.startswith("components.") for n in direct_imports(path))
    )
    assert importers == []
    from components.specs import NAMES

    for name in NAMES:
        closure = import_closure(f"components.{name}", roots=("pipelines", "components", "trace_core"))
        assert any(m.startswith("pipelines.steps.") for m in closure), name


def test_the_compiled_component_specs_are_the_components_compiled() -> None:
    """The DAG is built from ``components/specs/``: one file per component, each the component
    compiled now (a change to a component that is not recompiled fails here)."""
    from components.specs import NAMES, SPECS, stale

    assert sorted(p.stem for p in SPECS.glob("*.yaml")) == sorted(NAMES)
    assert stale() == [], "components/specs is stale: run `python -m components.specs`"


def test_a_component_without_its_compiled_spec_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pipelines import dag

    monkeypatch.setattr(dag, "SPECS", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"component 'train'.*python -m components.specs"):
        dag.load_component("train")

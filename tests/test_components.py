"""Components and their library helpers: lineage and reuse, prepare_data failing the run on bad
data. (The registry's promotion rule is tested in test_pipeline.py, next to its MLflow server.)"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # components/ and pipelines/ live at the repository root
    sys.path.insert(0, str(REPO))

from pipelines.lineage import (  # noqa: E402
    LINEAGE_KEYS,
    StageCache,
    config_hash,
    fingerprint,
    lineage_tags,
    tree_digest,
)


# --------------------------------------------------------------------------------------- lineage
def test_fingerprints_are_deterministic_and_sensitive() -> None:
    a = fingerprint("train", {"lr": 1e-4, "steps": 3}, "fp-data")
    assert a == fingerprint("train", {"steps": 3, "lr": 1e-4}, "fp-data")  # key order does not matter
    assert a != fingerprint("train", {"lr": 1e-4, "steps": 4}, "fp-data")
    assert a != fingerprint("evaluate", {"lr": 1e-4, "steps": 3}, "fp-data")
    assert config_hash({"a": [1, 2]}) != config_hash({"a": [2, 1]})
    with pytest.raises(ValueError, match="stage"):
        fingerprint("")


def test_tree_digest_follows_content_and_names(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("one")
    first = tree_digest(tmp_path / "d")
    (tmp_path / "d" / "x.txt").write_text("two")
    assert tree_digest(tmp_path / "d") != first
    (tmp_path / "d" / "x.txt").write_text("one")
    assert tree_digest(tmp_path / "d") == first
    (tmp_path / "d" / "x.txt").rename(tmp_path / "d" / "y.txt")
    assert tree_digest(tmp_path / "d") != first
    with pytest.raises(ValueError, match="does not exist"):
        tree_digest(tmp_path / "missing")


def test_code_digest_follows_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.lineage import code_digest

    pkg = tmp_path / "digestpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = code_digest("digestpkg")
    (pkg / "core.py").write_text("X = 2\n")
    assert code_digest("digestpkg") != first
    (pkg / "core.py").write_text("X = 1\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"compiled")  # not source: ignored
    assert code_digest("digestpkg") == first
    with pytest.raises(ValueError, match="not found"):
        code_digest("no_such_module_here")


def test_import_closure_follows_every_way_this_code_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.lineage import import_closure

    files = {
        "clospkg/__init__.py": "",
        "clospkg/entry.py": "from . import near\n\ndef run():\n    from clospkg.sub import lazy\n"
                            "    import subprocess\n    subprocess.run(['python', '-m', 'clospkg.by_name'])\n"
                            "    return 'helper.py'\n",
        # a string that only starts like a module name (a prefix test) names no module
        "clospkg/near.py": "from clospkg.lazyload import Thing\nOURS = 'clospkg.'\n",
        "clospkg/helper.py": "X = 1\n",  # run by path from entry
        "clospkg/by_name.py": "",
        "clospkg/sub/__init__.py": "",
        "clospkg/sub/lazy.py": "from ..deep import value\n",
        "clospkg/deep.py": "value = 1\n",
        "clospkg/lazyload/__init__.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
        "clospkg/lazyload/part.py": "",
        "clospkg/unused.py": "import clospkg.entry\n",  # imports the entry; the entry does not import it
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    closure = import_closure("clospkg.entry", roots=("clospkg",))
    assert set(closure) == {"clospkg", "clospkg.entry", "clospkg.near", "clospkg.helper", "clospkg.by_name",
                            "clospkg.sub", "clospkg.sub.lazy", "clospkg.deep", "clospkg.lazyload",
                            "clospkg.lazyload.part"}
    assert closure["clospkg.deep"] == tmp_path / "clospkg" / "deep.py"
    with pytest.raises(ValueError, match="not found"):
        import_closure("clospkg.missing", roots=("clospkg",))


def _step_digests(root: Path) -> dict[str, str]:
    """Each pipeline step's code digest over the copy of the project at ``root`` (a fresh
    interpreter, so ``root``'s packages are the ones found)."""
    import subprocess

    steps = ["train", "evaluate", "compare", "warm_start", "build_retriever_index"]
    script = ("import json; from pipelines.lineage import closure_digest; "
              f"print(json.dumps({{s: closure_digest('pipelines.steps.' + s) for s in {steps!r}}}))")
    out = subprocess.run([sys.executable, "-c", script], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_step_reruns_when_code_it_imports_changes_and_only_then(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    for package in ("trace_core", "pipelines", "components"):
        shutil.copytree(repo / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    before = _step_digests(tmp_path)
    # The tiny models' weight draw: the trainer reaches it only through other modules.
    models = tmp_path / "trace_core" / "models.py"
    models.write_bytes(models.read_bytes() + b"\n")
    after_models = _step_digests(tmp_path)
    assert after_models["train"] != before["train"] and after_models["warm_start"] != before["warm_start"]
    # The warm start's SFT loop: the trainer never imports it, so a trained result is reused.
    sft = tmp_path / "trace_core" / "warmstart" / "sft.py"
    sft.write_bytes(sft.read_bytes() + b"\n")
    after_sft = _step_digests(tmp_path)
    assert after_sft["warm_start"] != after_models["warm_start"]
    assert {k: v for k, v in after_sft.items() if k != "warm_start"} == {
        k: v for k, v in after_models.items() if k != "warm_start"}


def test_stage_cache_reuses_only_complete_entries(tmp_path: Path) -> None:
    cache = StageCache(tmp_path)
    assert cache.lookup("train-trace", "abc") is None
    work = cache.start("train-trace", "abc")
    (work / "policy").mkdir()
    assert cache.lookup("train-trace", "abc") is None  # not committed: a crash here is redone
    record = cache.commit("train-trace", "abc", {"run_id": "r1"})
    assert cache.lookup("train-trace", "abc") == record == {"run_id": "r1", "stage": "train-trace",
                                                            "fingerprint": "abc"}
    assert StageCache(tmp_path, enabled=False).lookup("train-trace", "abc") is None
    resumed = cache.start("train-trace", "zzz")
    (resumed / "checkpoint").write_text("step 2")
    assert (cache.start("train-trace", "zzz", resume=True) / "checkpoint").read_text() == "step 2"
    assert not (cache.start("train-trace", "zzz") / "checkpoint").exists()
    cache.commit("train-trace", "abc", {"run_id": "r1"})
    assert not (cache.start("train-trace", "abc", resume=True) / "policy").exists()  # finished: start over
    with pytest.raises(ValueError, match="without '/'"):
        cache.entry("a/b", "abc")


def test_lineage_tags_name_all_five(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_RL_GIT_SHA", "0123abc")
    monkeypatch.setenv("TRACE_RL_IMAGE", "registry.example.com/trace-rl/trace-rl-cpu:0.1.0")
    tags = lineage_tags(dvc_data_hash="fb3b.dir", kfp_run_id="run-7", config={"x": 1})
    assert set(tags) == set(LINEAGE_KEYS)
    assert tags["lineage.git_sha"] == "0123abc"
    assert tags["lineage.image"].endswith("trace-rl-cpu:0.1.0")
    assert tags["lineage.dvc_data_hash"] == "fb3b.dir" and tags["lineage.kfp_run_id"] == "run-7"
    assert tags["lineage.config_hash"] == config_hash({"x": 1})
    monkeypatch.delenv("TRACE_RL_GIT_SHA")
    monkeypatch.delenv("TRACE_RL_IMAGE")
    local = lineage_tags(dvc_data_hash="", kfp_run_id="", config={}, repo=REPO)
    assert local["lineage.image"] == "local" and len(local["lineage.git_sha"].split("-")[0]) == 40


# --------------------------------------------------------------------------------------- prepare_data
def _prepare(tmp_path: Path, data_config: dict, uri: str, name: str):
    from kfp import dsl

    from components.prepare_data import prepare_data

    out = dsl.Dataset(name="data", uri=str(tmp_path / name / "data"))
    version = prepare_data.python_func(
        data_config=json.dumps(data_config), workspace=str(tmp_path / "ws"), reuse=True, tracking_uri=uri,
        experiment="prepare-test", kfp_run_id="test", data=out)
    return version, out


@pytest.fixture(scope="module")
def embedded_data(tmp_path_factory) -> Path:
    from trace_core.data.generate import generate

    out = tmp_path_factory.mktemp("embedded") / "data"
    generate(out)
    return out


def test_prepare_data_validates_and_records_the_dvc_version(embedded_data, tmp_path: Path) -> None:
    from trace_core.data.generate import dvc_recorded_md5

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = {"source": "regenerate", "data_dir": str(tmp_path / "unused"), "dvc_file": str(REPO / "data.dvc")}
    version, out = _prepare(tmp_path, cfg, uri, "a")
    assert version == dvc_recorded_md5(REPO / "data.dvc") == out.metadata["dvc_md5"]
    assert (Path(out.path) / "math" / "train.jsonl").is_file() and out.metadata["files"] == 7
    again, out2 = _prepare(tmp_path, cfg, uri, "b")  # reused: same version, same MLflow run
    assert again == version and out2.metadata["run_id"] == out.metadata["run_id"]
    assert out2.metadata["fingerprint"] == out.metadata["fingerprint"]


def test_prepare_data_fails_the_run_on_invalid_data(embedded_data, tmp_path: Path) -> None:
    from trace_core.data.validation import DataValidationError

    bad = tmp_path / "bad"
    shutil.copytree(embedded_data, bad)
    lines = (bad / "math" / "train.jsonl").read_text().splitlines()
    row = json.loads(lines[3])
    row["answers"] = []  # a math example without an answer breaks the suite
    lines[3] = json.dumps(row)
    (bad / "math" / "train.jsonl").write_text("\n".join(lines) + "\n")
    cfg = {"source": "path", "data_dir": str(bad), "dvc_file": str(REPO / "data.dvc")}
    with pytest.raises(DataValidationError, match="math/train.jsonl") as err:
        _prepare(tmp_path, cfg, f"sqlite:///{tmp_path / 'mlflow.db'}", "bad")
    assert row["id"] in err.value.bad_ids
    wrong = tmp_path / "wrong.dvc"
    wrong.write_text("outs:\n- md5: 00000000000000000000000000000000.dir\n  path: data\n")
    with pytest.raises(ValueError, match="records 00000000000000000000000000000000.dir"):
        _prepare(tmp_path, {"source": "regenerate", "data_dir": "x", "dvc_file": str(wrong)},
                 f"sqlite:///{tmp_path / 'mlflow.db'}", "wrong")


# --------------------------------------------------------------------------------------- thin components
def _component_functions() -> list[tuple[Path, ast.FunctionDef]]:
    found = []
    for path in sorted((REPO / "components").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any("component" in ast.unparse(d) for d in node.decorator_list):
                found.append((path, node))
    return found


def test_every_component_body_is_a_thin_call() -> None:
    """A component unpacks its artifacts and calls its step; the work lives in pipelines/ and trace_core/."""
    functions = _component_functions()
    # specs.py compiles the components' specs: a tool beside them, not a component
    modules = {p.stem for p in (REPO / "components").glob("*.py")} - {"__init__", "specs"}
    assert {p.stem for p, _ in functions} == modules
    for path, fn in functions:
        lines = fn.end_lineno - fn.body[0].lineno + 1
        assert lines <= 40, f"{path.name}: {fn.name}'s body is {lines} lines"
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                top = node.module.split(".")[0]
                assert top in ("pipelines", "trace_core") or top in sys.stdlib_module_names, (path.name, node.module)


def test_the_components_package_leaves_sys_path_alone() -> None:
    tree = ast.parse((REPO / "components" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n) == "sys.path"]


def test_every_component_body_imports_from_the_repository_root_alone() -> None:
    """What KFP runs is the body's source alone, in a fresh interpreter whose sys.path holds the
    working directory (``python3 -m``): each import of every body must resolve from there."""
    import subprocess

    imports = sorted({ast.unparse(node) for _, fn in _component_functions() for node in ast.walk(fn)
                      if isinstance(node, ast.Import | ast.ImportFrom)})
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}  # no PYTHONPATH: only the working directory
    out = subprocess.run([sys.executable, "-c", "\n".join(imports)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_train_step_places_its_inputs_by_typed_replacement_and_keys_reuse_on_the_rest(tmp_path: Path) -> None:
    """Where the inputs and the run are (paths, the tracking target) never changes the defining
    configuration; anything else does; placing a configuration leaves the given one unchanged."""
    from dataclasses import replace

    from pipelines.steps.artifacts import ArtifactRef, StepContext
    from pipelines.steps.train import PLACED, defining_config, placed
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig

    base = load_config(TrainConfig, None, ["task.family=qa", "task.train_file='{testbed}/pool.jsonl'"])
    moved = load_config(TrainConfig, None, ["task.family=qa", "task.train_file=/elsewhere/pool.jsonl",
                                            "output_dir=/somewhere", "policy_model=/models/p",
                                            "task.data_dir=/d", "tracking.tracking_uri=http://host:5000"])
    assert defining_config(base) == defining_config(moved)
    assert defining_config(base) != defining_config(replace(base, budget=replace(base.budget, roots_M=32)))
    assert defining_config(base)["task"]["data_dir"] == PLACED
    with_warmup = replace(base, predictor_warmup=replace(base.predictor_warmup, task_file="{testbed}/warmup.jsonl"))
    assert defining_config(with_warmup) != defining_config(base)  # the warm-up counts as on/off
    ctx = StepContext(str(tmp_path), False, "sqlite:///x.db", "exp")
    cfg = placed(with_warmup, ArtifactRef("/data"), ArtifactRef("/index"), ArtifactRef("/policy"),
                 ArtifactRef("/bed"), ctx, tmp_path / "run")
    assert (cfg.task.train_file, cfg.predictor_warmup.task_file) == ("/bed/pool.jsonl", "/bed/warmup.jsonl")
    assert (cfg.task.data_dir, cfg.task.index_dir, cfg.policy_model) == ("/data", "/index", "/policy")
    assert cfg.tracking.tracking_uri == "sqlite:///x.db" and cfg.tracking.spool_dir == str(tmp_path / "run" / "spool")
    assert with_warmup.task.train_file == "{testbed}/pool.jsonl"  # the given configuration is unchanged
    assert defining_config(cfg) == defining_config(with_warmup)


def test_artifact_metadata_travels_as_a_dict_and_refuses_a_key_it_does_not_know() -> None:
    from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef

    made = ArtifactMetadata(fingerprint="f", method="trace", run_id="r", score=0.25, primary_metric="pass_at_1")
    assert made.to_dict() == {"fingerprint": "f", "method": "trace", "run_id": "r", "score": 0.25,
                              "primary_metric": "pass_at_1"}
    assert ArtifactMetadata.from_dict(made.to_dict()) == made

    class Artifact:  # what a KFP artifact hands a component: a path and a metadata dict
        path = "/x"
        metadata = {"fingerprint": "f", "fingerprnt": "typo"}

    with pytest.raises(ValueError, match=r"artifact /x: keys \['fingerprnt'\] are not fields of ArtifactMetadata"):
        ArtifactRef.of(Artifact())

"""Shared test fixtures: the pinned tiny Qwen3 policies and one engine of each kind per session.

vLLM's start-up costs ~25 s, so every test module that needs an engine shares these; tests that
change an engine's weights put the original ones back."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override EngineConfig.kv_cache_bytes

import contextlib  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from trace_core.models import TinyQwen3Config, build_tiny_qwen3  # noqa: E402
from trace_core.rollout import EngineConfig  # noqa: E402

# verl's adapter tests import verl, which lives in its own environment: test_integration_verl runs them there
collect_ignore = ["verl_env"]
BLOCK = 32
DATA = Path(__file__).resolve().parents[1] / "data"  # the embedded default (`make data`)
MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def engine_config(path, **kw) -> EngineConfig:
    return EngineConfig(model_path=str(path), dtype="float32", block_size=BLOCK, max_model_len=1024,
                        kv_cache_bytes=64 << 20, seed=0, **kw)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny models run fastest on one thread (per-step overhead dominates; OMP spin-waits hurt
    on a 2-core machine)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Two tiny Qwen3 policies with the same tokenizer and different weights (seeds 0 and 1)."""
    root = tmp_path_factory.mktemp("tiny_qwen3")
    return {seed: build_tiny_qwen3(root / f"seed{seed}", TinyQwen3Config(seed=seed)) for seed in (0, 1)}


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models[0])


@pytest.fixture(scope="session")
def reference_models(tiny_models):
    import torch
    from transformers import AutoModelForCausalLM

    return {seed: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            for seed, path in tiny_models.items()}


@pytest.fixture(scope="session")
def vllm_engine(tiny_models):
    pytest.importorskip("vllm")
    from trace_core.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(engine_config(tiny_models[0]))
    yield engine
    engine.close()


@contextlib.contextmanager
def batched_threads():
    """Two torch threads for a while: batched work (SFT, embedding a corpus) gains from the second
    core, unlike the tiny models' per-token decoding that the session default of one is for."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def text_encoder():
    """The packaged MiniLM encoder, loaded once per session (a CPU model load costs seconds)."""
    from trace_core.retrieval import RetrieverConfig, TextEncoder

    return TextEncoder(RetrieverConfig())


@pytest.fixture(scope="session")
def kb_qa_index(tmp_path_factory, text_encoder):
    """A flat dense index of the embedded KB-QA corpus (``kb.generate(KBConfig())``, which is what
    ``data/qa/corpus.jsonl`` holds), built once per session; returns ``(index_dir, build_report)``."""
    from trace_core.data import kb
    from trace_core.retrieval import RetrieverConfig, build_index

    _, passages, _ = kb.generate(kb.KBConfig())
    out = tmp_path_factory.mktemp("kb_qa_index") / "qa_index"
    with batched_threads():
        report = build_index(passages, out, RetrieverConfig(batch_size=64), encoder=text_encoder, progress=False)
    return out, report


WARM_TRAIN_TASKS = 4  # training tasks per family the session's warm checkpoint is fitted to


@pytest.fixture(scope="session")
def warm_checkpoint(tmp_path_factory, kb_qa_index):
    """A tiny policy warm-started on the first WARM_TRAIN_TASKS training tasks of math and QA until
    it reproduces their demonstrations (full-demonstration SFT, 100 epochs; loss ~0.003): on those
    tasks it is an RL starting point with mixed rewards by construction. The demonstrations see the
    real tools' observations (the sandbox, the session's dense index), so a rollout's context is the
    one the policy was fitted to; fitted to the experts' stand-in observations instead, it garbles its
    QA turns once the retriever's passages differ and succeeds on ~1 QA rollout in 32. The error draw
    (seed 1) corrupts one demonstration per family (asserted below), so a faithful policy fails there
    and succeeds elsewhere. On held-out tasks it has the turn format but not the skill. Positions for
    BFCL's ~10k-token prompts; its ``init/`` sibling is the random model it started from."""
    import dataclasses

    from trace_core.warmstart.demos import DemoConfig
    from trace_core.warmstart.pipeline import FULL_SFT, WarmStartConfig, run_warm_start
    from trace_core.warmstart.policy import WARM_MODEL

    out = tmp_path_factory.mktemp("warm")
    config = WarmStartConfig(
        data_dir=str(DATA), out_dir=str(out), families=("math", "qa"), train_tasks=WARM_TRAIN_TASKS, eval_tasks=0,
        real_observations=True, qa_index=str(kb_qa_index[0]), demos=DemoConfig(seed=1),
        model=dataclasses.replace(WARM_MODEL, max_position_embeddings=32_768),  # room for BFCL's ~10k-token prompts
        view_sft=None,
        sft=dataclasses.replace(FULL_SFT, lr=5e-3, epochs=100.0, batch_size=WARM_TRAIN_TASKS, warmup_steps=10,
                                progress=False))
    with batched_threads():
        report = run_warm_start(config)
    assert report["sft"]["full"]["last10_loss"] < 0.05, report["sft"]
    # Both families' demonstrations are part right, part wrong: the rewards' mix is demonstrated.
    assert all(0 < report["demos"][f]["correct_rate"] < 1 for f in ("math", "qa")), report["demos"]
    return Path(report["policy_dir"])


# Two short BFCL training entries (2 user turns each), of different scenarios.
WARM_FC_TASKS = ("multi_turn_base_64", "multi_turn_base_70")


@pytest.fixture(scope="session")
def warm_fc_checkpoint(tmp_path_factory):
    """A tiny policy warm-started on WARM_FC_TASKS (BFCL multi-turn, the expert's ground-truth calls)
    until it reproduces its demonstrations; the expert's error draw closes a user turn of the
    second one early, so on these two tasks its rewards are mixed. Its tokenizer is trained on these
    prompts, so a ~10k-character BFCL prompt is ~3.3k tokens."""
    import dataclasses

    from trace_core.warmstart.demos import DemoConfig
    from trace_core.warmstart.pipeline import FULL_SFT, WarmStartConfig, run_warm_start
    from trace_core.warmstart.policy import WARM_MODEL

    out = tmp_path_factory.mktemp("warm_fc")
    config = WarmStartConfig(
        data_dir=str(DATA), out_dir=str(out), families=("fc",), train_task_ids=WARM_FC_TASKS, eval_tasks=0,
        demos=DemoConfig(epsilon=0.15, seed=3),  # base_64 demonstrated right, base_70 closing a turn early
        model=dataclasses.replace(WARM_MODEL, max_position_embeddings=8192),
        view_sft=None,
        sft=dataclasses.replace(FULL_SFT, lr=5e-3, epochs=80.0, batch_size=1, warmup_steps=5, max_length=8192,
                                progress=False))
    with batched_threads():
        report = run_warm_start(config)
    assert 0 < report["demos"]["fc"]["correct_rate"] < 1, report["demos"]  # right and wrong demonstrations
    assert report["sft"]["full"]["last10_loss"] < 0.05, report["sft"]
    return Path(report["policy_dir"])


@pytest.fixture(scope="session")
def hf_engine(tiny_models):
    from trace_core.rollout.hf_engine import HFEngine

    engine = HFEngine(engine_config(tiny_models[0]))
    yield engine
    engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real MLflow tracking server (sqlite backend, local artifact store) we can stop and restart."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port, self.proc = root, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [MLFLOW, "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        # A loaded machine (two cores shared with a training run) takes over a minute to start it.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()  # a fixture whose set-up fails is never torn down: leave no server behind
        raise RuntimeError("mlflow server did not start in 240 s")

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a server still starting on a loaded machine may ignore it
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A real MLflow tracking server for one test module."""
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow"), free_port())
    srv.start()
    yield srv
    srv.stop()




# ------------------------------------------------------------------------------------ fault injection
class FaultyEngine:
    """The real engine with a fault injected from its ``after``-th poll on: ``error`` is raised, or,
    with ``error=None``, the poll hangs (a sleep in Python, which the guard's watchdog signal
    interrupts). ``polls`` counts the polls made."""

    def __init__(self, inner, after: int, error: BaseException | None) -> None:
        self.inner, self.after, self.error, self.polls = inner, after, error, 0

    def submit(self, requests):
        self.inner.submit(requests)

    def poll(self):
        self.polls += 1
        if self.polls >= self.after:
            if self.error is not None:
                raise self.error
            time.sleep(3600)
        return self.inner.poll()

    @property
    def num_pending(self):
        return self.inner.num_pending

    def load_weights(self, weights):
        self.inner.load_weights(weights)

    def close(self):
        pass


# ------------------------------------------------------------------------------------ fault summary
# A test counts as a fault injection only if it asks for the `fault` fixture, and it reports what it
# expected and what it found; the summary adds those figures up. Its area is its module's
# FAULT_AREA. (The module mark `faults` only selects the suite for `make faults`.) The area and the
# figures travel in each test report's user properties, so the summary is the same whether the
# tests ran in this process or in pytest-xdist's workers (whose reports the controller receives).
FAULT_AREA_KEY = "fault_area"  # a user property of every report of a fault test: its area
FAULT_FIGURE_KEY = "fault_figure"  # a user property per figure: (unit, expected, found)
_FAULT_TESTS: dict[str, str] = {}  # nodeid -> area, from the reports: skipped tests are known too
_FAULT_OUTCOMES: dict[str, str] = {}  # nodeid -> passed / failed / error / skipped
_FAULT_FIGURES: dict[str, list[tuple[str, int, int]]] = {}  # nodeid -> (unit, expected, found)
_RECORD_AREAS = ("tracking store", "training loop", "trainer resume")  # where records can be lost


class FaultReport:
    """What one fault-injection test checked: `records(written, stored)` for the records a fault
    must not lose (each written one found exactly once), `artifacts(expected, loadable)`, and
    `check(unit, expected, found)` for anything else counted (attacks contained, inputs refused)."""

    def __init__(self, node: pytest.Item) -> None:
        self.node = node

    def check(self, unit: str, expected: int, found: int) -> None:
        self.node.user_properties.append((FAULT_FIGURE_KEY, (unit, int(expected), int(found))))

    def records(self, written, stored) -> None:
        stored = list(stored)
        self.check("records", len(written), sum(1 for r in written if stored.count(r) == 1))

    def artifacts(self, expected: int, loadable: int) -> None:
        self.check("artifacts", expected, loadable)


@pytest.fixture
def fault(request) -> FaultReport:
    """Marks the test as a fault injection and takes its figures (see `FaultReport`)."""
    return FaultReport(request.node)


# Under pytest-xdist (`make test`: two workers, a test file each at a time) the files are handed out
# in collection order; the heaviest go first, so that the quick ones fill in at the end and both
# workers finish together (alphabetical order left the two longest files last, on one worker).
# file_seconds.json: each file's seconds in a one-process run (pytest --durations), refreshed by
# hand when a file's cost changes much; a file it does not name counts as quick. Order only: a
# one-process run keeps pytest's own order.
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def heaviest_files_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """``items`` with their files ordered by ``seconds`` (file name -> seconds, largest first; the
    rest keep their order after them), each file's tests in their own order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(files, key=lambda f: -float(seconds.get(Path(f).name, 0.0)))  # sorted() is stable
    return [item for f in order for item in files[f]]


def pytest_collection_modifyitems(session, config, items) -> None:
    if hasattr(config, "workerinput") and FILE_SECONDS.is_file():
        import json

        items[:] = heaviest_files_first(items, json.loads(FILE_SECONDS.read_text()))
    for item in items:
        if "fault" in getattr(item, "fixturenames", ()):
            area = getattr(getattr(item, "module", None), "FAULT_AREA", "other")
            item.user_properties.append((FAULT_AREA_KEY, area))


def pytest_runtest_logreport(report) -> None:
    properties = list(getattr(report, "user_properties", ()))
    area = next((value for key, value in properties if key == FAULT_AREA_KEY), None)
    if area is None:
        return
    _FAULT_TESTS[report.nodeid] = area
    # each report carries every figure the test has reported so far: the latest report holds them all
    _FAULT_FIGURES[report.nodeid] = [tuple(value) for key, value in properties if key == FAULT_FIGURE_KEY]
    previous = _FAULT_OUTCOMES.get(report.nodeid)
    if report.skipped:
        outcome = "skipped"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    else:
        outcome = "passed"
    if previous in (None, "passed") or outcome == "error":  # a teardown error overrides a passed call
        _FAULT_OUTCOMES[report.nodeid] = outcome


def fault_summary() -> list[str]:
    """The summary's lines, computed from the fault tests' outcomes and reported figures."""
    if not _FAULT_TESTS:
        return []
    areas: dict[str, dict] = {}
    for nodeid, area in _FAULT_TESTS.items():
        row = areas.setdefault(area, {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "not run": 0, "units": {}})
        outcome = _FAULT_OUTCOMES.get(nodeid, "not run")
        row[outcome] += 1
        if outcome in ("passed", "failed"):
            for unit, expected, found in _FAULT_FIGURES.get(nodeid, []):
                sums = row["units"].setdefault(unit, [0, 0])
                sums[0] += expected
                sums[1] += found
    lines = []
    for area, row in sorted(areas.items()):
        ran = row["passed"] + row["failed"]
        text = f"{area:26s} {ran:4d} injected, {row['passed']:4d} held, {row['failed']} broke"
        for key in ("error", "skipped", "not run"):
            if row[key]:
                text += f", {row[key]} {'errored' if key == 'error' else key}"
        for unit, (expected, found) in sorted(row["units"].items()):
            text += f"; {unit} {found}/{expected}"
        lines.append(text)
    total = {k: sum(r[k] for r in areas.values()) for k in ("passed", "failed", "error", "skipped", "not run")}
    records = [f for nodeid, figs in _FAULT_FIGURES.items() if _FAULT_OUTCOMES.get(nodeid) in ("passed", "failed")
               for f in figs if f[0] == "records"]
    unmeasured = sum(1 for n, area in _FAULT_TESTS.items() if area in _RECORD_AREAS
                     and _FAULT_OUTCOMES.get(n, "not run") in ("skipped", "error", "not run"))
    if records:
        written = sum(e for _, e, _ in records)
        lost = sum(max(0, e - f) for _, e, f in records)
        lost_text = f"{lost} of {written} written ({len(records)} checks)"
    else:
        lost_text = "not measured (no test that counts records ran)"
    if unmeasured:
        lost_text += f"; {unmeasured} tracking/training fault tests did not run (skipped or errored): not counted"
    lines.append(f"{total['passed'] + total['failed']} faults injected, {total['passed']} held, "
                 f"{total['failed']} broke, {total['error']} errored, {total['skipped'] + total['not run']} skipped; "
                 f"records lost: {lost_text}")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = fault_summary()
    if lines:
        terminalreporter.section("fault injection")
        for line in lines:
            terminalreporter.write_line(line)


# ------------------------------------------------------------------------------------ heartbeat
# A long test (the miniature pipeline, DVC in a clone, the two-process ZeRO run) prints no dot for
# minutes; a line every 30 s names it, so that a slow suite is never mistaken for a hung one. It is
# written to the terminal's own file descriptor, which pytest keeps while it captures fd 1 (a
# plain write from a thread during a test would land in that test's captured output). Under
# pytest-xdist the controller prints it (the workers' starts and finishes reach it as hooks; a
# worker has no terminal), for every test running at once.
_RUNNING: dict[str, list[float]] = {}  # nodeid -> [started, last said] (time.monotonic)
_RUNNING_LOCK = threading.Lock()


def _terminal_fd(config) -> int | None:
    capman = config.pluginmanager.getplugin("capturemanager")
    out = getattr(getattr(capman, "_global_capturing", None), "out", None)
    fd = getattr(out, "targetfd_save", None)
    return fd if isinstance(fd, int) else None


def _test_heartbeat(fd: int) -> None:
    while True:
        time.sleep(2.0)
        now, lines = time.monotonic(), []
        with _RUNNING_LOCK:
            for nodeid, times in _RUNNING.items():
                if now - times[1] >= 30.0:
                    times[1] = now
                    lines.append(f"\n  ... still running {nodeid} ({now - times[0]:.0f} s)\n")
        for line in lines:
            os.write(fd, line.encode())


def pytest_runtest_logstart(nodeid, location) -> None:
    now = time.monotonic()
    with _RUNNING_LOCK:
        _RUNNING[nodeid] = [now, now]


def pytest_runtest_logfinish(nodeid, location) -> None:
    with _RUNNING_LOCK:
        _RUNNING.pop(nodeid, None)


def pytest_sessionstart(session) -> None:
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller says it
        return
    fd = _terminal_fd(session.config)
    if fd is not None:
        threading.Thread(target=_test_heartbeat, args=(fd,), name="test-heartbeat", daemon=True).start()


def tiny_overrides(model_dir: Path, out: Path, uri: str, method: str, steps: int = 1) -> list[str]:
    """TrainConfig overrides of a seconds-long run: the tiny policy on fixed-turn tasks, tiny budgets."""
    return [
        f"method={method}", f"steps={steps}", f"policy_model={model_dir}", f"output_dir={out}",
        "task.family=fixed-turns", "task.envs.fixed_turns.turns=3", "task.envs.fixed_turns.prompts=16",
        "budget.roots_M=8", "budget.expansion_N=1", "budget.group_size_G=4", "budget.max_per_prompt=4",
        "budget.pool_factor=1", "agent.max_new_tokens=8", "agent.max_total_tokens=1024",
        "engine.max_model_len=1024", "engine.kv_cache_mb=64", "policy.lr=1e-3", "policy.micro_batches=1",
        "predictor.tiny_hidden_size=32", "predictor.tiny_intermediate_size=64", "progress=false",
        f"tracking.tracking_uri={uri}", "tracking.experiment=trainer-tests", "tracking.retry_interval_s=0",
    ]

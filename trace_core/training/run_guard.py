"""What a training run checks before any work, and the one writer it allows per run folder.

Everything here runs before a model, an engine or a tracking run exists, and is cheap (file
system calls, a JSON file or two, one hash of the training file):

* :func:`check_inputs`: every path the run reads or writes (``policy_model``, ``output_dir``, the
  tracking store, the data files) exists where it must, is a regular file or a folder as it must,
  is readable, and is writable where the run writes; the engine fits the model's positions. A
  broken rule is a :class:`~trace_core.config.ConfigError` naming the dotted key, its value and
  the rule.
* :func:`hold_output_dir`: the exclusive lock on ``output_dir`` for the life of the run
  (:mod:`trace_core.locks`): a second writer, started with the first or after its first
  checkpoint, is refused at once with the holder's pid. So no other process resumes from,
  rotates or rewrites a checkpoint while a run owns the folder: checkpoint rotation never
  deletes a checkpoint another trainer is loading, because no other trainer can be loading one.
* :func:`run_identity` and :func:`check_resume`: the result-defining fields of a run (method,
  advantage, budget, seeds, the data: its family, the digest of its file) are kept in every
  checkpoint, and beside the tracking spool from the moment the run exists (``RUN_IDENTITY_FILE``:
  a run killed before its first checkpoint has a spool and a tracking run but no checkpoint); a
  resume whose configuration differs in any of them is refused, naming each field with the
  folder's value and this configuration's (``steps`` may grow: that extends a run).

:class:`RunRefused` (a folder held by another writer, a checkpoint of another configuration) and
:class:`~trace_core.config.ConfigError` are what ``trace-rl train`` reports in one line with
exit status 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from trace_core.config import ConfigError
from trace_core.envs.families import get_family
from trace_core.errors import RunRefused
from trace_core.locks import LOCK_NAME, HeldLock, LockHeld, hold, lead_process
from trace_core.tracking import sqlite_path
from trace_core.training.config import TrainConfig

RUN_IDENTITY_FILE = "run_identity.json"  # in output_dir, written when the tracking run is created


# ============================================================================ paths
def train_file(cfg: TrainConfig) -> Path | None:
    """The training file the run reads (None: a synthetic family's own tasks)."""
    t = cfg.task
    if get_family(t.family).synthetic_tasks is not None:
        return None
    return Path(t.train_file or Path(t.data_dir) / t.family / "train.jsonl")


def index_dir_of(cfg: TrainConfig) -> Path:
    """Where the run's retriever index is (for a family that reads one): ``task.index_dir``, else
    ``<output_dir>/<family>_index``."""
    return Path(cfg.task.index_dir or Path(cfg.output_dir) / f"{cfg.task.family}_index")


def check_inputs(cfg: TrainConfig) -> None:
    """Every path of ``cfg`` and the engine's fit to the model, before anything is loaded
    (see the module docstring); raises :class:`ConfigError`."""
    check_model_dir("policy_model", cfg.policy_model)
    check_writable_dir("output_dir", Path(cfg.output_dir))
    check_store("tracking.tracking_uri", cfg.tracking.tracking_uri)
    data = train_file(cfg)
    if data is not None:
        key = "task.train_file" if cfg.task.train_file else "task.data_dir"
        hint = ("" if cfg.task.train_file
                else " (generate the embedded data with `python -m trace_core.data.generate --out data`)")
        check_readable_file(key, data, hint)
    if cfg.predictor_warmup.task_file:
        check_readable_file("predictor_warmup.task_file", Path(cfg.predictor_warmup.task_file))
    corpus = get_family(cfg.task.family).index_corpus
    if corpus is not None and not index_dir_of(cfg).is_dir():  # built from the corpus at start
        check_readable_file("task.data_dir", Path(cfg.task.data_dir) / corpus)
    positions = model_positions(cfg.policy_model)
    if positions is not None and cfg.engine.max_model_len > positions:
        raise ConfigError(f"engine.max_model_len = {cfg.engine.max_model_len} exceeds the model's "
                          f"max_position_embeddings = {positions} ({Path(cfg.policy_model) / 'config.json'}): "
                          "a history must fit the model")


def check_model_dir(key: str, path: str) -> None:
    """A local transformers model directory: a folder holding a readable ``config.json``."""
    where = Path(path)
    if not str(path).strip():
        raise ConfigError(f"{key} must be a non-empty path, got {path!r}")
    if not where.exists():
        raise ConfigError(f"{key} {path} does not exist: it must be a local model directory "
                          "(written by save_pretrained; never a hub id)")
    if not where.is_dir():
        raise ConfigError(f"{key} {path} is not a folder: it must be a local model directory")
    _readable(key, where / "config.json", f"{key} {path} holds no readable config.json: it must be a "
                                          "local model directory (written by save_pretrained)")


def model_positions(path: str) -> int | None:
    """The model's ``max_position_embeddings`` (None: its config does not say)."""
    try:
        value = json.loads((Path(path) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def check_writable_dir(key: str, path: Path) -> None:
    """A folder the run can create (or has) and write: every existing part of the path is a folder,
    and the deepest existing one is writable (not on a read-only file system)."""
    probe = path
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent
    for part in [probe, *probe.parents]:
        if part.exists() and not part.is_dir():
            raise ConfigError(f"{key} {path} cannot be a folder: {part} is a file")
    if not probe.exists():
        raise ConfigError(f"{key} {path} cannot be created: {probe} is a broken link")
    if _read_only_fs(probe):
        raise ConfigError(f"{key} {path} must be writable, but {probe} is on a read-only file system")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{key} {path} must be writable, but this process cannot write {probe}")


def check_readable_file(key: str, path: Path, hint: str = "") -> None:
    """A regular file the run can read (not a folder, a FIFO, a device or a symlink loop)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path} does not exist{hint}") from None
    except OSError as err:  # ELOOP (a symlink loop), EACCES on a parent, ...
        raise ConfigError(f"{key}: {path} cannot be opened: {err.strerror or err}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{key}: {path} is a folder; it must be a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{key}: {path} is not a regular file (a FIFO, a socket or a device); it must be one")
    _readable(key, path, f"{key}: {path} cannot be read")


def _readable(key: str, path: Path, message: str) -> None:
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as err:
        raise ConfigError(f"{message} ({err.strerror or err})") from None


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_store(key: str, uri: str) -> None:
    """A local tracking store (sqlite file or folder) the run can write: the database file, when
    it exists, is a regular writable file in a writable folder (sqlite writes a journal beside
    it); when it does not, its folder can be created. Remote stores are checked by the tracker's
    own start-up check (:meth:`~trace_core.tracking.MLflowTracker.preflight`)."""
    db = sqlite_path(uri)
    if db is not None:
        if db.exists() or db.is_symlink():
            try:
                st = db.stat()
            except OSError as err:
                raise ConfigError(f"{key} {uri}: {db} cannot be opened: {err.strerror or err}") from None
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{key} {uri}: {db} is not a regular file; it must be a sqlite database")
            if _read_only_fs(db) or not os.access(db, os.R_OK | os.W_OK):
                raise ConfigError(f"{key} {uri} must be a store this run can write to, but {db} is read-only")
        try:
            check_writable_dir(key, db.parent)
        except ConfigError as err:
            raise ConfigError(f"{err} (the folder of the sqlite store {uri})") from None
        return
    if uri.startswith("file:") or "://" not in uri:
        folder = Path(uri[len("file://"):] if uri.startswith("file://") else uri.removeprefix("file:"))
        check_writable_dir(key, folder)


# ============================================================================ one writer
def hold_output_dir(out: Path) -> HeldLock | None:
    """Create ``out`` and hold its writer lock (None in a rank > 0 of a distributed job, whose rank
    0 holds it for the job); raises :class:`RunRefused` naming the holder's pid, or
    :class:`ConfigError` when the folder cannot be made."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not lead_process():
            return None
        return hold(out / LOCK_NAME, f"output_dir {out}")
    except LockHeld as err:
        raise RunRefused(f"{err}: one run writes one output_dir") from None
    except OSError as err:
        raise ConfigError(f"output_dir {out} must be a folder this run can write: {err.strerror or err}") from None


# ============================================================================ resume
IDENTITY_KEYS = ("method", "advantage", "seed", "agent.seed", "policy.seed", "predictor.seed", "task.family",
                 "task.envs.fixed_turns.turns", "task.envs.fixed_turns.prompts", "pool_success.seed",
                 "predictor_warmup.seed")


def run_identity(cfg: TrainConfig) -> dict[str, Any]:
    """The fields that define a run's results, as a checkpoint keeps them: the method and its
    advantage, every budget field and every cost-model field (a token budget is planned at its
    estimates), every seed, and the data (family, the training file's and the
    warm-up file's SHA-256 — their content, not their path, which may move between attempts)."""
    from trace_core.config import flatten

    flat = flatten(cfg)
    identity = {k: flat[k] for k in IDENTITY_KEYS}
    identity.update({k: v for k, v in flat.items() if k.startswith(("budget.", "costs."))})
    data = train_file(cfg)
    identity["task.train_file (sha256)"] = _digest(data) if data is not None else None
    warm = cfg.predictor_warmup.task_file
    identity["predictor_warmup.task_file (sha256)"] = _digest(Path(warm)) if warm else None
    return identity


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_resume(saved: dict[str, Any] | None, now: dict[str, Any], output_dir: Path, held: str,
                 source: str = "checkpoint") -> None:
    """Refuse to go on with what ``output_dir`` holds (``held``, in words: a checkpoint, or the
    tracking spool of a run stopped before its first one; ``source``, the noun the message gives
    its values), made by a run of identity ``saved``,
    under a configuration of identity ``now`` when any result-defining field differs; a folder
    written before identities were kept (``saved`` None) goes on as before. Only the fields both
    identities hold are compared: a field renamed or added since is not a difference of the run."""
    if saved is None:
        return
    differ = [k for k in sorted(set(saved) & set(now)) if saved[k] != now[k]]
    if not differ:
        return
    shown = "; ".join(f"{k} = {saved.get(k)!r} in the {source}, {now.get(k)!r} here" for k in differ)
    raise RunRefused(f"output_dir {output_dir} holds {held} of another run: {shown}. Going on would mix two "
                     "runs: use another output_dir, or the values it was made with to resume it")

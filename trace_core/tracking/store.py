"""The tracking store: its experiment, its lock, its client, and the sqlite file behind a local URI."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_core.locks import exclusive as exclusive_lock


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None,
                      client: Any = None) -> str:
    """The id of experiment ``name``, created (with ``artifact_location`` when given) if missing.
    Two processes creating it at once both get its id: on a sqlite store they take turns
    (:func:`store_lock`); elsewhere the one that loses the race reads the winner's."""
    client = client or store_client(tracking_uri)
    with store_lock(tracking_uri):
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except Exception:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None: another store, or in memory)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """On a sqlite store, the exclusive lock of the file beside the database (``<db>.lock``) for a
    block; nothing elsewhere. MLflow creates and migrates a new sqlite store on first use, and two
    processes doing that at once fail (one finds the other's half-made tables)."""
    db = sqlite_path(tracking_uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(db.with_name(db.name + ".lock")):
        yield


_STORES_READY: set[str] = set()  # sqlite stores this process has opened (created and migrated)


def store_client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` on ``tracking_uri``. A sqlite store's first use (which creates it, or
    migrates an old one) is made under :func:`store_lock`, so that concurrent runs take turns."""
    from mlflow.tracking import MlflowClient

    if sqlite_path(tracking_uri) is None or tracking_uri in _STORES_READY:
        return MlflowClient(tracking_uri=tracking_uri)
    with store_lock(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)  # MLflow opens the store here: tables, migrations
        client.search_experiments(max_results=1)
    _STORES_READY.add(tracking_uri)
    return client

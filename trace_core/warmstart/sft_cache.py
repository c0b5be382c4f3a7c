"""A fine-tuned policy kept by the inputs that made it, so a warm start whose inputs are unchanged
skips its SFT.

SFT is the slow part of a warm start (minutes on a CPU) and a pure function of its inputs: the
starting model folder (weights, tokenizer, config), the demonstrations (their token ids and loss
masks, written to ``demos.jsonl``), the SFT settings of each stage and the torch version. The key
is a SHA-256 over exactly those; the code that drew the demonstrations and built the model is
covered through what it wrote, so a change that alters them alters the key, and one that does
not (a refactor, a change elsewhere) keeps it. An entry is a folder ``<cache>/<key>/`` holding the
fine-tuned ``policy/`` (with its ``sft_log.json``), the earlier stages' logs and ``inputs.json``
(what the key covers, readable); it is written beside and renamed, so an entry is whole or absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

POLICY = "policy"
INPUTS = "inputs.json"


def _digest_tree(path: Path, digest: Any) -> None:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
        digest.update(f.read_bytes() + b"\0")


def sft_key(start_dir: str | Path, demos_file: str | Path, stages: Sequence[Any]) -> str:
    """The key of an SFT from the model in ``start_dir`` on the demonstrations in ``demos_file``
    with the settings ``stages`` (one per stage, a dataclass or None for a skipped one)."""
    import torch

    digest = hashlib.sha256()
    _digest_tree(Path(start_dir), digest)
    _digest_tree(Path(demos_file), digest)
    settings = [asdict(s) if is_dataclass(s) else s for s in stages]
    # progress only changes what is printed
    settings = [{k: v for k, v in s.items() if k != "progress"} if isinstance(s, dict) else s for s in settings]
    digest.update(json.dumps({"stages": settings, "torch": torch.__version__}, sort_keys=True).encode())
    return digest.hexdigest()[:20]


def restore(cache: str | Path, key: str, out: str | Path, logs: Sequence[str] = ()) -> bool:
    """Copy the entry ``key`` of ``cache`` (its policy, and the stage logs named ``logs``) into
    ``out`` (``out/policy``, ``out/<log>``); False when the cache holds no such entry."""
    entry = Path(cache) / key
    if not (entry / POLICY / "sft_log.json").is_file():
        return False
    out = Path(out)
    shutil.rmtree(out / POLICY, ignore_errors=True)
    shutil.copytree(entry / POLICY, out / POLICY)
    for name in logs:
        shutil.copy2(entry / name, out / name)
    return True


def keep(cache: str | Path, key: str, policy_dir: str | Path, logs: Mapping[str, str | Path] | None = None,
         inputs: Mapping[str, Any] | None = None) -> Path:
    """Add ``policy_dir`` (and the stage logs ``logs``: name -> file) to ``cache`` as entry
    ``key``, with ``inputs`` described in ``inputs.json``; an entry already there is kept."""
    entry = Path(cache) / key
    if (entry / POLICY / "sft_log.json").is_file():
        return entry
    tmp = Path(cache) / f".{key}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(policy_dir, tmp / POLICY)
    for name, path in (logs or {}).items():
        shutil.copy2(path, tmp / name)
    described = {k: asdict(v) if is_dataclass(v) else v for k, v in (inputs or {}).items()}
    (tmp / INPUTS).write_text(json.dumps(described, indent=1, sort_keys=True, default=str) + "\n")
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(tmp, entry)
    return entry

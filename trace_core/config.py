"""Typed configuration: nested dataclasses loaded from YAML with ``key=value`` overrides.

One mechanism for every config in the project (trainer, predictor, engine, pipeline): a config
is a dataclass whose fields are scalars, lists, or nested dataclasses, each documented where it
is declared. Loading is strict — an unknown key or a value of the wrong type is an error naming
the dotted key, so a typo in a sweep never silently falls back to a default; a number setting
must be finite (``nan`` and ``inf`` are refused for every float field), and each dataclass's
``__post_init__`` checks its own ranges.

    cfg = load_config(TrainConfig, "configs/embedded.yaml", ["trainer.steps=3", "method=grpo"])
    flat = flatten(cfg)          # {"trainer.steps": 3, ...} — MLflow params, DVC params
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or key broke a rule; the message names the dotted key."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert ``value`` to the annotated type ``tp`` or raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{key}: {value!r} matches none of {[_type_name(a) for a in args]}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {list(allowed)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {value!r}")
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if not math.isfinite(number):  # no setting means nan or inf: it would only fail later, far from here
            raise ConfigError(f"{key}: {value!r} is not a finite number (every number setting must be finite)")
        return number
    if tp is str:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if tp is Path:
        return Path(value)
    if isinstance(value, tp):
        return value
    raise ConfigError(f"{key}: cannot read {value!r} as {_type_name(tp)}")


def _build(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = prefix or cls.__name__
        raise ConfigError(
            f"unknown key {(prefix + '.' if prefix else '') + unknown[0]!s} in {where}; "
            f"known keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:  # __post_init__ checks
        text = str(err)
        if text.split(" ", 1)[0] in fields:  # "lr must be ..." of section policy: "policy.lr must be ..."
            raise ConfigError(f"{prefix}.{text}" if prefix else text) from err
        raise ConfigError(f"{prefix or cls.__name__}: {text}") from err


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """Build ``cls`` from a (nested) mapping; strict about keys and types."""
    return _build(cls, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (paths and tuples as strings and lists)."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(cfg)


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": value}`` for every leaf field (for MLflow params and DVC params)."""
    out: dict[str, Any] = {}
    for k, v in (to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg).items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` strings (value parsed as YAML) to a nested dict, in order."""
    data = yaml.safe_load(yaml.safe_dump(data)) or {}  # deep copy of plain data
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. trainer.steps=10)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: empty key")
        value = yaml.safe_load(raw) if raw.strip() else ""
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = nxt
        node[parts[-1]] = value
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """Defaults of ``cls``, then the YAML file at ``path`` (if any), then ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded
    data = apply_overrides(data, overrides)
    base = to_dict(cls())  # type: ignore[call-arg]
    return from_dict(cls, _merge(base, data))


def _merge(base: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)

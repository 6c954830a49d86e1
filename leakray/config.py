"""Composable configuration: YAML files merged left to right, then `a.b=value` overrides."""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from leakray.errors import BadInput

DEFAULT = Path(__file__).resolve().parent.parent / "conf" / "default.yaml"  # the checkout's conf/


def merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_override(cfg: dict, item: str) -> dict:
    if "=" not in item:
        raise BadInput(f"override {item!r} must look like key.sub=value")
    dotted, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw else None
    node = cfg
    keys = dotted.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise BadInput(f"override {item!r}: {key!r} is not a section")
    node[keys[-1]] = value
    return cfg


def load_config(paths: list[str | Path] = (), overrides: list[str] = ()) -> dict:
    cfg: dict = {}
    for path in [DEFAULT, *paths]:
        path = Path(path)
        try:
            cfg = merge(cfg, yaml.safe_load(path.read_text()) or {})
        except (OSError, yaml.YAMLError) as exc:
            raise BadInput(f"cannot read config: {exc}", path=str(path)) from exc
    for item in overrides:
        apply_override(cfg, item)
    return cfg


def build(cls, section: dict | None, where: str) -> Any:
    """A dataclass from a config section, naming unknown keys instead of a bare TypeError."""
    section = dict(section or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise BadInput(f"unknown keys {unknown} in config section '{where}'; known: {sorted(known)}")
    return cls(**section)

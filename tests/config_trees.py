"""Nested config mappings from dotted keys, shared by tests/test_fuzz.py and bench/fuzz_cli.py."""

from __future__ import annotations


def nested(key: str, value) -> dict:
    """``{"a": {"b": value}}`` for ``key="a.b"``."""
    *parents, leaf = key.split(".")
    out: dict = {leaf: value}
    for part in reversed(parents):
        out = {part: out}
    return out


def merged(*parts: dict) -> dict:
    """The mappings merged left to right, sections merged recursively, later leaves winning."""
    out: dict = {}
    for part in parts:
        for name, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(name), dict):
                out[name] = merged(out[name], value)
            else:
                out[name] = value
    return out

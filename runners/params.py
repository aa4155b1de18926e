"""Swept parameters as typed Arrow columns.

A sweep point is identified by the config keys its command line overrode
(``load.concurrency=16``).  Each such key becomes one column, named by the
dotted key, in every Parquet table of the point and in the sweep's
``summary.parquet``.  A column's type comes from the key's *declaration* (the
annotations of :class:`simcore.SimConfig`'s dataclasses), never from the value
given, so ``detokenization.base_ms=0`` and ``=2.85`` both give float64 and every
job of a sweep has the same schema.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from functools import lru_cache
from typing import Any, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException

import simcore
from simcore.arrow_np import from_pylist
from simcore.config import dotted_keys

#: Top-level keys handled by the runner, never passed to :func:`simcore.run`.
RUNNER_KEYS = ("force", "sweep", "export")

#: Columns every Parquet row of a sweep point carries before its parameters.
ID_COLUMNS = ("run_id", "seed")

_SCALARS = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def _arrow_type(annotation: Any) -> pa.DataType | None:
    """The Arrow type of a dataclass field annotation (None if not a plain value)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _arrow_type(members[0]) if len(members) == 1 else None
    if origin in (tuple, list):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        inner = _arrow_type(args[0]) if len(set(args)) == 1 else None
        return None if inner is None else pa.list_(inner)
    return _SCALARS.get(annotation)


def _walk(cls: type, prefix: str, out: dict[str, pa.DataType]) -> None:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            _walk(hint, f"{prefix}{field.name}.", out)
        else:
            arrow = _arrow_type(hint)
            if arrow is not None:
                out[f"{prefix}{field.name}"] = arrow


@lru_cache(maxsize=1)
def declared_types() -> dict[str, pa.DataType]:
    """Arrow type of every leaf config key, from the config dataclasses.

    Returns
    -------
    dict of str to pyarrow.DataType
        ``{"load.concurrency": int64, "load.request_rate": float64,
        "metrics.percentiles": list<double>, ...}``.  A leaf missing from the
        dataclasses (a key added to the defaults only) takes the type of its
        default value, when that is a plain scalar.
    """
    out: dict[str, pa.DataType] = {}
    _walk(simcore.SimConfig, "", out)
    for key in dotted_keys():
        if key not in out:
            default = lookup(simcore.DEFAULTS, key)
            if type(default) in _SCALARS:
                out[key] = _SCALARS[type(default)]
    return out


def column_type(key: str) -> pa.DataType:
    """The Arrow type of the parameter column ``key`` (JSON text when not a plain value)."""
    return declared_types().get(key, pa.string())


def lookup(tree: Mapping[str, Any] | None, key: str, default: Any = None) -> Any:
    """The value at dotted ``key`` in a nested mapping, or ``default``."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def assign(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key`` in a nested dict, creating intermediate dicts."""
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested mapping by dotted key, in insertion order."""
    out: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


@lru_cache(maxsize=1)
def config_leaves() -> frozenset[str]:
    """Every leaf config key (``engine.aggregated.replicas``)."""
    return frozenset(dotted_keys())


@lru_cache(maxsize=1)
def config_sections() -> frozenset[str]:
    """Every config section above a leaf (``engine``, ``engine.aggregated``)."""
    return frozenset(leaf.rsplit(".", i)[0] for leaf in config_leaves() for i in range(1, leaf.count(".") + 1))


def is_config_key(key: str) -> bool:
    """True for a simcore config key: a leaf or a section (``metrics.goodput``)."""
    return key in config_leaves() or key in config_sections()


def is_runner_key(key: str) -> bool:
    """True for ``force``, ``sweep``, ``sweep.batch.load.concurrency``, ``export.detailed``..."""
    return key.split(".")[0] in RUNNER_KEYS


def parse_overrides(overrides: Iterable[str]) -> Iterator[Override]:
    """Hydra's parse of each override string; strings it cannot parse are skipped
    (Hydra itself reports them)."""
    for line in overrides:
        override = _parse_override(line)
        if override is not None:
            yield override


@lru_cache(maxsize=4096)
def _parse_override(line: str) -> Override | None:
    """One override string parsed (None if Hydra cannot parse it); the points of a job share their job's lines."""
    try:
        (override,) = _parser().parse_overrides([line])
    except HydraException:
        return None
    return override


@lru_cache(maxsize=1)
def _parser() -> OverridesParser:
    return OverridesParser.create()


def override_keys(overrides: Iterable[str]) -> list[str]:
    """The simcore config keys named by Hydra override strings, in order, once each.

    Parameters
    ----------
    overrides : iterable of str
        ``hydra.overrides.task`` of a job (``load.concurrency=4``,
        ``+sweep.batch.seed=[0,1]``, ``~max_time_ms`` ...).

    Returns
    -------
    list of str
        Keys of the simcore configuration only: runner keys (``force``,
        ``sweep.*``, ``export.*``), config-group choices and package overrides
        are left out.
    """
    keys: list[str] = []
    for override in parse_overrides(overrides):
        key = override.key_or_group
        if override.package is not None or "/" in key or is_runner_key(key) or not is_config_key(key):
            continue
        if key not in keys:
            keys.append(key)
    return keys


def group_choices(overrides: Iterable[str]) -> dict[str, str]:
    """The preset choices among Hydra override strings: ``{"engine": "pd_1p2d"}`` for ``engine=pd_1p2d``.

    A config section given a name is a config-group choice; its parameter
    column holds that name rather than the section it composes.
    """
    choices = {}
    leaves = config_leaves()
    # A plain assignment of a leaf (``load.concurrency=4``) is never a choice: left
    # out before Hydra's parse, which costs about 2 ms per sweep point's new line.
    lines = [line for line in overrides if _assigned_key(line) not in leaves]
    for override in parse_overrides(lines):
        key, value = override.key_or_group, override.value()
        if isinstance(value, str) and key not in leaves and is_config_key(key):
            choices[key] = value
    return choices


#: ``key=`` at the start of an override, the key in Hydra's ID / dotted-path characters.
_PLAIN_ASSIGNMENT = re.compile(r"([A-Za-z_$][\w$.-]*)=")


def _assigned_key(line: str) -> str | None:
    """The key of a plain ``key=value`` override (no ``+``, ``~``, ``@package`` or group path), else None."""
    match = _PLAIN_ASSIGNMENT.match(line)
    return match.group(1) if match else None


def format_value(value: Any) -> str:
    """A value as it would be written in a Hydra override (``2.85``, ``null``, ``[50,99]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


def _coerce(value: Any, type_: pa.DataType) -> Any:
    """``value`` as a Python value of Arrow type ``type_``, or None when it does not fit."""
    if value is None:
        return None
    if pa.types.is_string(type_):
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, allow_nan=True)
    if pa.types.is_boolean(type_):
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if pa.types.is_integer(type_):
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        return None
    if pa.types.is_floating(type_):
        return float(value) if isinstance(value, (int, float)) else None
    if pa.types.is_list(type_):
        if not isinstance(value, (list, tuple)):
            return None
        items = [_coerce(item, type_.value_type) for item in value]
        return None if any(item is None for item in items) else items
    return None


def parameter_field(key: str) -> pa.Field:
    """The Arrow field of the parameter column ``key`` (nullable, with metadata)."""
    return pa.field(
        key, column_type(key), metadata={"unit": "", "description": f"swept config key {key}"}
    )


def id_columns(run_id: str, seed: Any, keys: Sequence[str], values: Mapping[str, Any]) -> pa.Table:
    """The one-row table of constant columns a sweep point's Parquet rows carry.

    Parameters
    ----------
    run_id : str
        The point's id, unique within its sweep.
    seed : int or None
        The point's seed (None when its configuration was invalid).
    keys : sequence of str
        The sweep's parameter keys (``seed`` is left out: it has its own column).
    values : mapping
        The point's value of every key (missing: null).

    Returns
    -------
    pyarrow.Table
        Columns ``run_id`` (string), ``seed`` (int64), then one column per key
        typed by :func:`column_type`; a value that does not fit its type is null.
    """
    fields = [
        pa.field("run_id", pa.string(), nullable=False, metadata={"unit": "", "description": "sweep point id"}),
        pa.field("seed", pa.int64(), metadata={"unit": "", "description": "the point's seed"}),
    ]
    row: list[Any] = [run_id, _coerce(seed, pa.int64())]
    for key in keys:
        if key in ID_COLUMNS:
            continue
        field = parameter_field(key)
        fields.append(field)
        row.append(_coerce(values.get(key), field.type))
    schema = pa.schema(fields)
    return pa.Table.from_arrays(
        [from_pylist([value], field.type) for value, field in zip(row, fields)], schema=schema
    )

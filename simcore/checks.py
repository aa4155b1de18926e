"""Config keys declared once, and the value checks every stage's settings use.

A stage's settings dataclass declares each key as a field made by :func:`key`:
its default in the configuration tree and the check that turns a user value
into the field's value.  :func:`defaults` builds the stage's default tree from
those declarations and :func:`parse_keys` checks a merged tree into the
dataclass, so a key's name, default and check are written in one place.
Every check raises :class:`~simcore.errors.ConfigError` naming the dotted key,
the value and what is allowed.  Nothing here knows any stage.
"""

from __future__ import annotations

import copy
import math
from dataclasses import MISSING, field, fields
from functools import partial
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from simcore.errors import ConfigError
from simcore.units import INT64_MAX

#: Field metadata names: the key's default, its check, and where it sits in the tree.
_DEFAULT, _CHECK, _AT, _SECTION = "key_default", "key_check", "key_at", "key_section"
#: Field metadata names of a key's documentation (docs/options.md, ``replaysim --help``).
_DOC, _UNIT, _VALUES = "key_doc", "key_unit", "key_values"
_CALIBRATION = "key_calibration"
#: Units read from a key's name when it ends so (STYLE: names carry their unit).
UNIT_SUFFIXES = (("_ms", "ms"), ("_us", "µs"), ("_ns", "ns"), ("_gb_per_second", "GB/s"),
                 ("bytes_per_token", "bytes/token"), ("_tokens", "tokens"), ("_len", "tokens"))


def key(
    default: Any,
    check: Callable[..., Any] | None = None,
    *,
    at: tuple[str, ...] = (),
    optional: bool = False,
    doc: str = "",
    unit: str | None = None,
    values: str | None = None,
    calibration: tuple[float, float] | None = None,
    **options: Any,
) -> Any:
    """A dataclass field that is a config key.

    Parameters
    ----------
    default : Any
        The key's value in the default tree (null, a scalar or a list).
    check : callable or None
        ``check(path, value, **options)`` returning the field's value, or raising
        ConfigError; None: the stage's parser fills the field itself.
    at : tuple of str
        The key's place in the section's tree when it is not the field's name
        (``("allreduce", "curve")`` for ``allreduce_curve``).
    optional : bool
        Give the field ``default`` as its Python default too (a parser may leave
        it unset); ``default`` must then be immutable.
    doc : str
        What the key sets, in one sentence or two (``replaysim --help``, docs/options.md).
    unit : str or None
        Its unit; None: read from the name's suffix (:data:`UNIT_SUFFIXES`), else none.
    values : str or None
        The values allowed, in words; None: said by ``check`` and its options
        (:func:`allowed_values`).
    calibration : (float, float) or None
        A declared calibration parameter: the range ``replaysim-calibrate --fit KEY``
        searches by default (its default must leave results unchanged).
    **options
        Keyword arguments bound to ``check`` (``minimum=0``, ``allowed=...``).

    Returns
    -------
    dataclasses.Field
        A field without a Python default unless ``optional``.
    """
    bound = None if check is None else partial(check, **options)
    metadata = {_DEFAULT: default, _CHECK: bound, _AT: at, _DOC: doc, _UNIT: unit, _VALUES: values,
                _CALIBRATION: calibration}
    return field(default=default, metadata=metadata) if optional else field(metadata=metadata)


def section(cls: type, tree: Callable[[], dict[str, Any]] | None = None, doc: str = "") -> Any:
    """A dataclass field holding a nested section of keys.

    Parameters
    ----------
    cls : type
        The section's dataclass (its fields made by :func:`key` or :func:`section`).
    tree : callable or None
        Builds the section's default tree when its keys do not map one to one
        onto ``cls``'s fields; None: ``defaults(cls)``.
    doc : str
        What the section holds (``replaysim --help``, docs/options.md).

    Returns
    -------
    dataclasses.Field
        A field without a Python default.
    """
    return field(metadata={_SECTION: tree or partial(defaults, cls), _CHECK: cls, _DOC: doc})


def default_of(cls: type, name: str) -> Any:
    """The default of one key of a settings dataclass.

    Parameters
    ----------
    cls : type
        The settings dataclass.
    name : str
        The field's name.

    Returns
    -------
    Any
        The key's default (not copied: do not change it).
    """
    return cls.__dataclass_fields__[name].metadata[_DEFAULT]


def defaults(cls: type) -> dict[str, Any]:
    """The default tree of a settings dataclass, in field order (a fresh copy each call).

    Parameters
    ----------
    cls : type
        A dataclass whose key fields come from :func:`key` and :func:`section`.

    Returns
    -------
    dict[str, Any]
        ``{key: default}``, nested for sections and for keys declared ``at`` a path.
    """
    tree: dict[str, Any] = {}
    for f in fields(cls):
        if _SECTION in f.metadata:
            tree[f.name] = f.metadata[_SECTION]()
        elif _DEFAULT in f.metadata:
            *parents, name = f.metadata[_AT] or (f.name,)
            node = tree
            for parent in parents:
                node = node.setdefault(parent, {})
            node[name] = copy.deepcopy(f.metadata[_DEFAULT])  # a list or dict default is not shared
    return tree


class KeyDoc(NamedTuple):
    """One documented config key (docs/options.md, ``replaysim --help``)."""

    path: str  # dotted, from the root of the tree
    default: Any
    type: str  # the field's annotation
    unit: str  # "" for a count or a name
    values: str  # the values allowed, in words
    doc: str
    calibration: tuple[float, float] | None = None  # a declared calibration parameter's search range


def describe(cls: type, path: str = "") -> list[KeyDoc]:
    """Every key of a settings dataclass, sections included, in field order.

    Parameters
    ----------
    cls : type
        A dataclass whose key fields come from :func:`key` and :func:`section`.
    path : str
        Its dotted path (``"engine.aggregated"``); ``""`` for the root.

    Returns
    -------
    list of KeyDoc
        A key with no ``doc`` is listed with an empty one (a test finds it).
    """
    found: list[KeyDoc] = []
    for f in fields(cls):
        if _SECTION in f.metadata:
            inner, dotted = f.metadata[_CHECK], f"{path}.{f.name}" if path else f.name
            # a section whose keys are not fields (built from a registry) documents itself
            found.extend(inner.key_docs(dotted) if hasattr(inner, "key_docs") else describe(inner, dotted))
        elif _DEFAULT in f.metadata:
            at = f.metadata[_AT] or (f.name,)
            dotted = ".".join((path, *at)) if path else ".".join(at)
            unit = f.metadata[_UNIT]
            if unit is None:
                unit = next((u for suffix, u in UNIT_SUFFIXES if at[-1].endswith(suffix)), "")
            values = f.metadata[_VALUES]
            if values is None:
                values = allowed_values(f.metadata[_CHECK])
            found.append(KeyDoc(dotted, f.metadata[_DEFAULT], str(f.type), unit, values, f.metadata[_DOC],
                                f.metadata.get(_CALIBRATION)))
    return found


def section_doc(cls: type, name: str) -> str:
    """The description given to the section field ``name`` of ``cls``.

    Parameters
    ----------
    cls : type
        A settings dataclass.
    name : str
        One of its section fields.

    Returns
    -------
    str
        ``""`` when the section has none.
    """
    return cls.__dataclass_fields__[name].metadata.get(_DOC, "")


def allowed_values(check: Callable[..., Any] | None) -> str:
    """The values a key's check accepts, in words ("" when the check cannot say).

    Parameters
    ----------
    check : callable or None
        A check bound to its options by :func:`key`.

    Returns
    -------
    str
    """
    if not isinstance(check, partial):
        return ""
    func, opts = check.func, check.keywords
    null = " or null" if func in (optional_count, optional_number, optional_str) else ""
    if func in (count, optional_count):
        return f"integer >= {opts.get('minimum', 1)}{null}"
    if func in (number, optional_number):
        bound = f"> {opts.get('minimum', 0.0):g}" if opts.get("strict") else f">= {opts.get('minimum', 0.0):g}"
        if opts.get("maximum", math.inf) < math.inf:
            bound += f", <= {opts['maximum']:.4g}"
        return f"number {bound}{null}"
    if func is choice:
        return " | ".join(opts["allowed"])
    if func is flag:
        return "true | false"
    if func is optional_str:
        return "string or null"
    return ""


class Later:
    """A field value :func:`parse_keys` computes at the field's turn (so errors keep field order).

    Parameters
    ----------
    compute : callable
        Takes no argument and returns the field's value.
    """

    def __init__(self, compute: Callable[[], Any]) -> None:
        self.compute = compute


def parse_keys(cls: type, raw: Mapping[str, Any], path: str, **given: Any) -> Any:
    """Check every key and section of ``cls`` in field order, and build it.

    Parameters
    ----------
    cls : type
        The settings dataclass.
    raw : Mapping[str, Any]
        The section's merged tree.
    path : str
        The section's dotted path (``"load"``), prefixed to every key in messages.
    **given
        Fields the caller parses itself: a value, or a :class:`Later` computed
        at the field's turn.  Sections are parsed by this function unless given.

    Returns
    -------
    object
        An instance of ``cls``.

    Raises
    ------
    ConfigError
        The first key, in field order, whose value its check refuses.
    """
    values = {name: value for name, value in given.items() if not isinstance(value, Later)}
    for f in fields(cls):
        check = f.metadata.get(_CHECK)
        if isinstance(given.get(f.name), Later):
            values[f.name] = given[f.name].compute()
            continue
        if f.name in values or check is None:
            continue
        if _SECTION in f.metadata:
            values[f.name] = parse_keys(check, raw[f.name], f"{path}.{f.name}" if path else f.name)
            continue
        at = f.metadata[_AT] or (f.name,)
        value = raw
        for part in at:
            value = value[part]
        values[f.name] = check(".".join((path, *at)) if path else ".".join(at), value)
    missing = [f.name for f in fields(cls) if f.name not in values and f.default is MISSING and f.init]
    if missing:  # a parser bug, not a user error
        raise TypeError(f"{cls.__name__}: no value for {', '.join(missing)}")
    return cls(**values)


# ---------------------------------------------------------------- value checks


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), not a bool.

    Parameters
    ----------
    value : Any
        A user value.

    Returns
    -------
    bool
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or float (Python or NumPy), not a bool.

    Parameters
    ----------
    value : Any
        A user value.

    Returns
    -------
    bool
    """
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def shown(value: Any) -> str:
    """``repr`` of a value for a one-line message, a huge integer abbreviated.

    Parameters
    ----------
    value : Any
        A user value.

    Returns
    -------
    str
    """
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


#: The largest float a count key takes as an integer: every integer up to it is a float64 exactly.
EXACT_FLOAT_INT = 2**53


def count(path: str, value: Any, minimum: int = 1) -> int:
    """An integer key ``>= minimum`` that an int64 holds.

    A float that is exactly an integer (``1e6``, ``64.0``: YAML reads ``1e6``
    as a float) is taken as that integer when its magnitude is at most
    :data:`EXACT_FLOAT_INT` (2**53), where every integer is a float64 exactly;
    a larger float may not be the integer that was typed, and is refused.

    Parameters
    ----------
    path : str
        The dotted key, for the message.
    value : Any
        The user value.
    minimum : int
        The smallest value allowed.

    Returns
    -------
    int
    """
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        if abs(value) > EXACT_FLOAT_INT:
            raise ConfigError(f"{path} must be an integer; a float above 2**53 ({shown(value)}) may not be "
                              "the integer typed: write it out in digits")
        value = int(value)
    if not is_int(value) or value < minimum:
        raise ConfigError(f"{path} must be an integer >= {minimum}, got {shown(value)}")
    if value > INT64_MAX:
        raise ConfigError(f"{path} must be an integer <= {INT64_MAX} (int64), got {shown(value)}")
    return int(value)


def optional_count(path: str, value: Any, minimum: int = 1) -> int | None:
    """:func:`count`, or None for null.

    Parameters
    ----------
    path : str
        The dotted key, for the message.
    value : Any
        The user value.
    minimum : int
        The smallest value allowed.

    Returns
    -------
    int or None
    """
    return None if value is None else count(path, value, minimum)


def number(path: str, value: Any, *, minimum: float = 0.0, strict: bool = False, maximum: float = math.inf) -> float:
    """A finite number ``>= minimum`` (``> minimum`` if ``strict``) and ``<= maximum``.

    Parameters
    ----------
    path : str
        The dotted key, for the message.
    value : Any
        The user value.
    minimum, maximum : float
        The range allowed.
    strict : bool
        Whether ``minimum`` itself is refused.

    Returns
    -------
    float
    """
    try:
        finite = is_number(value) and math.isfinite(float(value))
    except OverflowError:  # an integer beyond float64
        finite = False
    if not finite:
        raise ConfigError(f"{path} must be a finite number, got {shown(value)}")
    value = float(value)
    if value > maximum:
        raise ConfigError(f"{path} must be <= {maximum:.4g}, got {value!r}")
    if strict and value <= minimum:
        raise ConfigError(f"{path} must be > {minimum:g}, got {value!r}")
    if not strict and value < minimum:
        raise ConfigError(f"{path} must be >= {minimum:g}, got {value!r}")
    return value


def optional_number(path: str, value: Any, **options: Any) -> float | None:
    """:func:`number`, or None for null.

    Parameters
    ----------
    path : str
        The dotted key, for the message.
    value : Any
        The user value.
    **options
        Passed to :func:`number`.

    Returns
    -------
    float or None
    """
    return None if value is None else number(path, value, **options)


def choice(path: str, value: Any, allowed: tuple[str, ...]) -> str:
    """One of the ``allowed`` names.

    Parameters
    ----------
    path : str
        The dotted key, for the message.
    value : Any
        The user value.
    allowed : tuple of str
        The names accepted, in the order the message lists them.

    Returns
    -------
    str
    """
    if value not in allowed:
        raise ConfigError(f"{path} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def flag(path: str, value: Any) -> bool:
    """A boolean key.

    Parameters
    ----------
    path : str
        The dotted key, for the message.
    value : Any
        The user value.

    Returns
    -------
    bool
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    return bool(value)


def optional_str(path: str, value: Any) -> str | None:
    """A non-empty string, or None for null.

    Parameters
    ----------
    path : str
        The dotted key, for the message.
    value : Any
        The user value.

    Returns
    -------
    str or None
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path} must be a non-empty string, got {value!r}")
    return value

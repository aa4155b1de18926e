"""The workload's and the load's settings: which requests exist and when they are sent.

Each key is declared once, as a field of a frozen dataclass (:func:`simcore.checks.key`):
its default and its check.  :func:`parse` and :func:`parse_load` turn the
merged ``workload`` and ``load`` trees into those dataclasses; the rules that
relate keys of several sections live in :mod:`simcore.config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from simcore.checks import (
    Later,
    choice,
    count,
    flag,
    is_int,
    key,
    number,
    optional_count,
    optional_number,
    optional_str,
    parse_keys,
    section,
)
from simcore.errors import ConfigError
from simcore.units import INT64_MAX, MAX_INSTANT_MS

WORKLOAD_SOURCES = ("synthetic", "table", "mooncake", "azure", "shared_prefix", "sessions")
#: Sources whose requests are drawn from keys (sized by them before anything is drawn).
GENERATED_SOURCES = ("synthetic", "shared_prefix")
FILE_SOURCES = ("table", "mooncake", "azure")
TRACE_SOURCES = ("mooncake", "azure")
#: Tokens per ``hash_ids`` block of a Mooncake trace when workload.block_size is null.
MOONCAKE_BLOCK_SIZE = 512
#: The trace-only workload keys and their defaults (set with another source: an error).
TRACE_KEYS = ("block_size", "drop_invalid", "max_requests", "time_window_ms")
LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal")
#: The workload keys only synthetic lengths read (prefix_tokens is checked on its own).
SYNTHETIC_KEYS = (
    "input_tokens", "output_tokens", "input_dist", "output_dist", "range_ratio", "input_std", "output_std"
)
SESSION_TURNS_DISTS = ("fixed", "uniform", "geometric")
LOAD_TYPES = ("closed_loop", "constant_rate", "poisson", "gamma", "trace")
OPEN_LOOP_GENERATED = ("constant_rate", "poisson", "gamma")


def _range_ratio(path: str, value: Any) -> float:
    ratio = number(path, value, strict=True)
    if ratio > 1:
        raise ConfigError(f"{path} must be in (0, 1], got {value!r}")
    return ratio


#: Bound of a priority value (either sign), far inside int64 so that no key overflows.
MAX_PRIORITY = 2**62


def _numbers_list(path: str, value: Any) -> list:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__") or iter(value) is value:
        raise ConfigError(f"{path} must be a list or null, got {value!r}")
    items = list(value)
    if not items:
        raise ConfigError(f"{path} must not be empty (null: none), got {value!r}")
    return items


def _priority_classes(path: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    out = []
    for item in _numbers_list(path, value):
        if not is_int(item) or abs(int(item)) > MAX_PRIORITY:
            raise ConfigError(f"{path} values must be integers within +-{MAX_PRIORITY}, got {item!r}")
        out.append(int(item))
    if len(set(out)) != len(out):
        raise ConfigError(f"{path} must not repeat a value, got {list(value)!r}")
    return tuple(out)


def _priority_weights(path: str, value: Any, classes: tuple[int, ...] | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    if classes is None:
        raise ConfigError(f"{path} needs workload.priority_classes, got {value!r}")
    weights = tuple(number(path, item, strict=True, maximum=1e300) for item in _numbers_list(path, value))
    if len(weights) != len(classes):
        raise ConfigError(f"{path} must give one weight per class ({len(classes)}), got {len(weights)}")
    return weights


@dataclass(frozen=True)
class SharedPrefixConfig:
    """inference-perf's ``shared_prefix`` workload: G groups of P prompts, each a
    group's system prompt followed by its own question (docs/semantics.md).
    Its names and defaults are inference-perf's (simcore/workload/shared_prefix.py)."""

    num_groups: int = key(10, count, doc="Groups of prompts sharing one system prompt.")
    num_prompts_per_group: int = key(10, count, doc="Prompts per group (each its own question).")
    system_prompt_len: int = key(
        100, count, minimum=0,
        doc="Tokens of the system prompt the prompts of a group share (0: none).",
    )
    question_len: int = key(50, count, doc="Tokens of each prompt's own question, after the system prompt.")
    output_len: int = key(50, count, doc="Output tokens of every prompt.")
    seed: int | None = key(
        None, optional_count, minimum=0,
        doc="Seed of the prompts' shuffled order; null: the run's generator (seed).",
    )

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.num_prompts_per_group

    @property
    def input_tokens(self) -> int:
        return self.system_prompt_len + self.question_len

    @property
    def hash_block_tokens(self) -> int:
        """Tokens per ``hash_ids`` entry: the system prompt is one entry, so that
        every engine block inside it is shared by the group, whatever its size."""
        return self.system_prompt_len or self.question_len

    @property
    def hash_blocks(self) -> int:
        """``hash_ids`` entries per prompt."""
        return -(-self.input_tokens // self.hash_block_tokens)


@dataclass(frozen=True)
class SessionsConfig:
    """Multi-turn sessions (docs/semantics.md, Sessions): each turn's prompt is the
    previous turn's prompt and answer plus ``new_input_tokens``.

    workload.source=sessions generates them; think_time_ms also paces a table's
    session_id/turn rows.  Defaults: AISimulate's synthetic-session source (4 turns
    of 1024 new input and 128 output tokens, no delay), 160 sessions = the default
    640 requests.
    """

    num_sessions: int = key(160, count, doc="Multi-turn sessions (conversations) generated.")
    turns: int = key(
        4, count,
        doc="Turns per session: the number (fixed), the most (uniform) or the mean (geometric).",
    )
    turns_dist: str = key(
        "fixed", choice, allowed=SESSION_TURNS_DISTS,
        doc="How the number of turns of a session is drawn.",
    )
    new_input_tokens: int = key(1024, count, doc="Tokens a turn adds to the previous prompt and answer.")
    output_tokens: int = key(128, count, doc="Output tokens of every turn.")
    think_time_ms: float = key(
        0.0, number, maximum=MAX_INSTANT_MS,
        doc="The client's pause between a turn's last token received and the next turn's send (table sessions too).",
    )
    system_prompt_tokens: int = key(
        0, count, minimum=0,
        doc="Tokens of a system prompt shared by every session's first prompt.",
    )


@dataclass(frozen=True)
class WorkloadConfig:
    source: str = key(
        "synthetic", choice, allowed=WORKLOAD_SOURCES,
        doc="Where requests come from: generated (synthetic, shared_prefix, sessions) or read from a file (table, mooncake, azure).",
    )
    path: str | None = key(
        None, optional_str,
        doc="The request table (CSV/Parquet, source=table) or trace file (mooncake JSONL, azure CSV).",
    )
    num_requests: int | None = key(
        640, optional_count,
        doc="Requests generated, or at most this many rows read from a file (the default too); null: all rows of a file.",
        unit="requests",
    )
    input_tokens: int = key(1024, count, doc="Prompt length, or its mean for a distribution (synthetic).")
    output_tokens: int = key(128, count, doc="Output length, or its mean for a distribution (synthetic).")
    input_dist: str = key("fixed", choice, allowed=LENGTH_DISTS, doc="Distribution of prompt lengths (synthetic).")
    output_dist: str = key("fixed", choice, allowed=LENGTH_DISTS, doc="Distribution of output lengths (synthetic).")
    range_ratio: float = key(
        1.0, _range_ratio,
        doc="uniform: lengths drawn in [floor(n x range_ratio), n].",
        values="number in (0, 1]",
    )
    input_std: float = key(
        0.0, number,
        doc="Standard deviation of prompt lengths (normal, lognormal).",
        unit="tokens",
    )
    output_std: float = key(
        0.0, number,
        doc="Standard deviation of output lengths (normal, lognormal).",
        unit="tokens",
    )
    block_size: int | None = key(
        None,
        doc="mooncake: tokens per hash_ids block; null: 512.",
        unit="tokens",
        values="integer >= 1 or null",
    )
    drop_invalid: bool = key(
        False, flag,
        doc="Traces: drop bad rows (counted as dropped_requests) instead of refusing the file.",
    )
    max_requests: int | None = key(
        None, optional_count,
        doc="Traces: read at most this many requests.",
        unit="requests",
    )
    time_window_ms: float | None = key(
        None, optional_number, strict=True, maximum=MAX_INSTANT_MS,
        doc="Traces: keep the rows less than this after the first good row.",
    )
    prefix_tokens: int = key(
        0, count, minimum=0,
        doc="synthetic: every prompt starts with this many identical tokens (a shared prefix for prefix caching).",
    )
    priority_classes: tuple[int, ...] | None = key(
        None, _priority_classes,
        doc="Each request's priority drawn from these values (for engine.<pool>.queue_order=priority; lower "
        "first), from a stream of its own under the seed; null: the table's priority column, else all 0.",
        values="list of distinct integers within +-2^62, or null",
    )
    priority_weights: tuple[float, ...] | None = key(
        None,
        doc="With priority_classes: their relative frequencies, one per class; null: equal.",
        values="list of numbers > 0 (one per class) or null",
    )
    shared_prefix: SharedPrefixConfig = section(SharedPrefixConfig)
    sessions: SessionsConfig = section(SessionsConfig)


@dataclass(frozen=True)
class LoadConfig:
    type: str = key(
        "closed_loop", choice, allowed=LOAD_TYPES,
        doc="How requests are sent: a closed loop of concurrency clients, an open loop at request_rate (constant, Poisson, gamma) or at the trace's timestamps.",
    )
    concurrency: int = key(
        64, count,
        doc="closed_loop: requests in flight (vllm bench serve --max-concurrency).",
        unit="requests",
    )
    request_rate: float | None = key(
        None, optional_number, strict=True,
        doc="Open loops: mean request rate.",
        unit="req/s",
    )
    burstiness: float = key(
        1.0, number, strict=True,
        doc="gamma: the gaps' shape factor (1: Poisson; below 1 burstier), as in vllm bench serve.",
    )
    think_time_ms: float = key(
        0.0, number,
        doc="closed_loop: a client's pause between receiving a request's last token and sending the next.",
    )
    speedup: float = key(
        1.0, number, strict=True,
        doc="trace: divide the trace's gaps by this factor (2: twice the pace).",
    )

    @property
    def closed_loop(self) -> bool:
        return self.type == "closed_loop"


def _trace_block_size(raw: Mapping[str, Any], path: str, shared_prefix: SharedPrefixConfig) -> int | None:
    """Tokens per ``hash_ids`` entry: workload.block_size, with the Mooncake default when
    null; the generated entries' size for shared_prefix (None for other sources)."""
    value = raw["block_size"]
    if raw["source"] == "shared_prefix":  # a set workload.block_size is refused by KEY_SCOPES
        return shared_prefix.hash_block_tokens
    if value is None:
        return MOONCAKE_BLOCK_SIZE if raw["source"] == "mooncake" else None
    return count(f"{path}.block_size", value)


def parse(raw: Mapping[str, Any], path: str = "workload") -> WorkloadConfig:
    """Check the ``workload`` section.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``workload`` tree.
    path : str
        Its dotted path, for messages.

    Returns
    -------
    WorkloadConfig

    Raises
    ------
    ConfigError
        A key's value is refused (its dotted path named).
    """
    shared_prefix = parse_keys(SharedPrefixConfig, raw["shared_prefix"], f"{path}.shared_prefix")
    if shared_prefix.input_tokens > INT64_MAX:  # the prompt length is an int64
        raise ConfigError(
            f"{path}.shared_prefix.question_len: system_prompt_len + question_len = "
            f"{shared_prefix.input_tokens} tokens exceeds int64"
        )
    # block_size is checked at its turn, between output_std and drop_invalid
    block_size = Later(lambda: _trace_block_size(raw, path, shared_prefix))
    weights = Later(lambda: _priority_weights(f"{path}.priority_weights", raw["priority_weights"],
                                              _priority_classes(f"{path}.priority_classes", raw["priority_classes"])))
    return parse_keys(WorkloadConfig, raw, path, shared_prefix=shared_prefix, block_size=block_size,
                      priority_weights=weights)


def parse_load(raw: Mapping[str, Any], path: str = "load") -> LoadConfig:
    """Check the ``load`` section.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``load`` tree.
    path : str
        Its dotted path, for messages.

    Returns
    -------
    LoadConfig
    """
    return parse_keys(LoadConfig, raw, path)

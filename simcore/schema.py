"""Arrow schemas of the result tables, declared once (SPEC §10).

Every field carries ``unit`` and ``description`` metadata; ``docs/results.md``
is checked against these declarations by the tests.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simcore.metrics.registry import DISTRIBUTIONS

SCHEMA_VERSION = "1"


def string_array(strings: list[str]) -> pa.StringArray:
    """``pa.array(strings, type=pa.string())``, built from its buffers.

    ``pa.array`` of Python strings imports pandas (~0.15 s) on first use
    (as does that of an ndarray: ``simcore.arrow_np``).

    Parameters
    ----------
    strings : list of str
        ASCII strings, under 2 GiB in all (32-bit offsets).

    Returns
    -------
    pyarrow.StringArray
        The strings, no nulls.
    """
    offsets = np.zeros(len(strings) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, strings), dtype=np.int32, count=len(strings)), out=offsets[1:])
    data = "".join(strings).encode("ascii")
    return pa.StringArray.from_buffers(len(strings), pa.py_buffer(offsets), pa.py_buffer(data))


def _field(name: str, type_: pa.DataType, unit: str, description: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"unit": unit, "description": description})


def _schema(fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={"schema_version": SCHEMA_VERSION})


#: Small enums (status, pool) become dictionary-encoded strings.
STATUS_TYPE = pa.dictionary(pa.int8(), pa.string())

#: TTFT stages in the order they happen; they sum to ttft_ms (SPEC §10).
TTFT_STAGES = (
    "tokenization_ms",
    "queue_ms",
    "prefill_ms",
    "transfer_ms",
    "decode_wait_ms",
    "detokenization_ms",
)

REQUESTS_SCHEMA = _schema(
    [
        _field("request_id", pa.string(), "", "request id (unique)", nullable=False),
        _field("status", STATUS_TYPE, "", "completed, rejected or incomplete", nullable=False),
        _field("worker", pa.int32(), "", "receiving worker (round_robin: send k mod replicas; docs/routing.md); null: never placed (not sent by the cap, or a session turn never sent)"),
        _field("rank", pa.int32(), "", "receiving attention-DP rank (round_robin: (k div replicas) mod attention_dp); null: never placed, or its least_loaded rank not yet picked"),
        _field("prefill_worker", pa.int32(), "", "P/D: prefill worker (= worker); null when aggregated"),
        _field("prefill_rank", pa.int32(), "", "P/D: prefill rank (= rank); null when aggregated"),
        _field("decode_worker", pa.int32(), "", "P/D: decode worker, global index (prefill workers come first); null until handed off"),
        _field("decode_rank", pa.int32(), "", "P/D: rank within the decode worker; null until handed off"),
        _field("input_tokens", pa.int64(), "tokens", "prompt length", nullable=False),
        _field("output_tokens", pa.int64(), "tokens", "requested output length", nullable=False),
        _field("generated_tokens", pa.int64(), "tokens", "tokens emitted by the engine by the cap", nullable=False),
        _field("num_preemptions", pa.int64(), "", "times the request was preempted (recompute)", nullable=False),
        _field("cached_tokens", pa.int64(), "tokens", "prompt tokens reused from the prefix cache at the first admission; null if never admitted"),
        _field("gpu_cached_tokens", pa.int64(), "tokens", "of cached_tokens, those found in GPU memory; null if never admitted"),
        _field("cpu_cached_tokens", pa.int64(), "tokens", "of cached_tokens, those loaded from the CPU tier (kv_offload); null if never admitted"),
        _field("kv_load_ms", pa.float64(), "ms", "CPU -> GPU KV loads, issue to end, summed over the request's loads; null if none"),
        _field("send_ms", pa.float64(), "ms", "instant the client sent the request"),
        _field("engine_arrival_ms", pa.float64(), "ms", "instant the engine received it (after tokenization)"),
        _field("first_admit_ms", pa.float64(), "ms", "start of the pass that first admitted it"),
        _field("first_token_emit_ms", pa.float64(), "ms", "end of the pass that emitted its first token"),
        _field("first_token_ms", pa.float64(), "ms", "instant the client received the first token"),
        _field("last_token_ms", pa.float64(), "ms", "instant the client received its last token (by the cap)"),
        *(_field(m.column, pa.float64(), m.unit, m.formula) for m in DISTRIBUTIONS if m.column),
        _field("transfer_start_ms", pa.float64(), "ms", "P/D: KV transfer start (end of the prefill pass that computed the prompt)"),
        _field("transfer_end_ms", pa.float64(), "ms", "P/D: KV transfer end (the request enters its decode rank)"),
        _field("tokenization_ms", pa.float64(), "ms", "TTFT stage: send -> engine arrival"),
        _field("queue_ms", pa.float64(), "ms", "TTFT stage: engine arrival -> first admission"),
        _field("prefill_ms", pa.float64(), "ms", "TTFT stage: first admission -> end of the pass that computed the prompt"),
        _field("transfer_ms", pa.float64(), "ms", "TTFT stage: KV transfer (P/D; else 0)"),
        _field("decode_wait_ms", pa.float64(), "ms", "TTFT stage: transfer end -> first visible token (P/D; else 0)"),
        _field("detokenization_ms", pa.float64(), "ms", "TTFT stage: first token emitted -> received"),
        _field("session_id", pa.string(), "", "multi-turn sessions: the request's session; null without sessions"),
        _field("turn", pa.int64(), "", "multi-turn sessions: the turn within its session (0 first); null without"),
        _field("priority", pa.int64(), "", "queue orders: the request's priority (the table's priority column or workload.priority_classes; lower first); null without"),
    ]
)

PASSES_SCHEMA = _schema(
    [
        _field("pool", STATUS_TYPE, "", "aggregated, prefill or decode", nullable=False),
        _field("worker", pa.int32(), "", "global worker index (prefill workers, then decode)", nullable=False),
        _field("rank", pa.int32(), "", "attention-DP rank within the worker", nullable=False),
        _field("start_ms", pa.float64(), "ms", "pass start", nullable=False),
        _field("end_ms", pa.float64(), "ms", "pass end (the slowest rank)", nullable=False),
        _field("num_prefill", pa.int64(), "", "prefill entries in the rank's batch", nullable=False),
        _field("prefill_tokens", pa.int64(), "tokens", "sum of n over prefill entries", nullable=False),
        _field("prefill_kv_tokens", pa.int64(), "tokens", "sum of computed + n over prefill entries", nullable=False),
        _field("num_decode", pa.int64(), "", "decode entries in the rank's batch", nullable=False),
        _field("decode_kv_tokens", pa.int64(), "tokens", "sum of computed + 1 over decode entries", nullable=False),
        _field("rank_time_ms", pa.float64(), "ms", "the rank's own time from the timing model", nullable=False),
        _field("blocks_in_use", pa.int64(), "blocks", "KV blocks in use right after batching", nullable=False),
    ]
)

TOKENS_SCHEMA = _schema(
    [
        _field("request_id", pa.string(), "", "request id", nullable=False),
        _field("index", pa.int64(), "", "token index within the request's output", nullable=False),
        _field("emitted_ms", pa.float64(), "ms", "end of the pass that emitted the token", nullable=False),
        _field("received_ms", pa.float64(), "ms", "instant the client received it (null after the cap)"),
    ]
)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast ``table`` to ``schema``; any drift in column names is an error.

    Parameters
    ----------
    table : pyarrow.Table
        A result table whose column names must equal ``schema.names``, in order.
    schema : pyarrow.Schema
        The output schema (``REQUESTS_SCHEMA``, ``TOKENS_SCHEMA`` or ``PASSES_SCHEMA``).

    Returns
    -------
    pyarrow.Table
        ``table`` cast to ``schema`` (with its field metadata: units, descriptions).
    """
    if table.column_names != schema.names:
        raise ValueError(f"result columns {table.column_names} do not match the schema {schema.names}")
    if all(column.type == field.type for column, field in zip(table.columns, schema)):
        return pa.Table.from_arrays(table.columns, schema=schema)  # no cast needed: no pyarrow.compute import
    return table.cast(schema)

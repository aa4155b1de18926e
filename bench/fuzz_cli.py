"""Issue 13's fuzz: bad inputs through the ``replaysim`` command and ``simcore.run``.

Generates the cases deterministically from ``--seed`` over six classes (types,
magnitudes, combinations, trace files, Hydra syntax, environment faults), runs
each command-line case as ``replaysim <overrides>`` in a subprocess from its
own temporary directory, and the API cases in batches inside worker
processes (at most ``--jobs`` processes at once, default 2).  A case is clean
when it exits 2 (or the documented environment code 74) with exactly one
stderr line ``replaysim: error: ...`` naming the field, ``file:line`` or path,
no traceback, and nothing new in its directory; an API case when
``simcore.run`` raises ``simcore.ConfigError`` with a one-line message naming
the same.  Prints counts per class and interface, then every failing case.

Environment cases mount a read-only and a full tmpfs (root only; skipped
otherwise).  ``python bench/fuzz_cli.py`` (``--seed``, ``--jobs``, ``--limit``,
``--classes types,traces``).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simcore.config import DEFAULTS, KEY_SCOPES, dotted_keys  # noqa: E402
from tests.config_trees import merged, nested  # noqa: E402

BAD_INPUT, ENVIRONMENT = 2, 74
TIMEOUT_S = 300
#: API cases run this many to a worker process (a crash reruns them one by one).
API_BATCH = 40
CLASSES = ("types", "magnitudes", "combinations", "traces", "hydra", "environment")


@dataclass
class Case:
    """One bad input: command-line overrides or an API config, the files it needs, what the error must name."""

    cls: str
    via: str  # "cli" or "api"
    name: str
    args: list[str] = field(default_factory=list)
    config: object = None
    requests_file: str | None = None  # API: a Parquet file of the case read as the requests table
    files: dict[str, bytes] = field(default_factory=dict)
    expect: tuple[str, ...] = ()  # the message must contain one of these
    codes: tuple[int, ...] = (BAD_INPUT,)


# ---------------------------------------------------------------- values

CHOICE_KEYS = {
    "workload.source", "workload.input_dist", "workload.output_dist", "load.type", "engine.mode",
    "engine.policy", "timing.type", "output.mode", "timing.backend", "timing.roofline.kv_dtype",
}
STRING_KEYS = {
    "workload.path", "output.dir", "timing.model", "timing.gpu", "timing.backend_version", "timing.profile",
    "timing.allreduce.curve",
}
LIST_KEYS = {"metrics.percentiles", "timing.cuda_graph_sizes"}
#: Wrong values of each list key (a list of capture sizes may hold 101; percentiles may not).
BAD_LISTS = {
    "metrics.percentiles": ["abc", 5, [101], [-1], ["a"], [[1]], {"a": 1}, [math.nan]],
    "timing.cuda_graph_sizes": ["abc", 5, [], [0], [-1], ["a"], [[1]], {"a": 1}, [math.nan], [1.5]],
}


def default_of(key: str):
    tree = DEFAULTS
    for part in key.split("."):
        tree = tree[part]
    return tree


FLAG_KEYS = {k for k in dotted_keys() if isinstance(default_of(k), bool)}
#: Keys whose values are counts (integers >= 1, or >= 0 for seed/prefix_tokens).
COUNT_KEYS = {
    k for k in dotted_keys()
    if k.rsplit(".", 1)[-1] in (
        "num_requests", "input_tokens", "output_tokens", "concurrency", "replicas", "attention_dp",
        "max_batched_tokens", "max_sequences", "num_blocks", "block_size", "context_length", "workers",
        "chunk_size", "max_requests", "prefix_tokens", "chunked_prefill_size", "max_prefill_tokens", "tp",
        "num_layers", "hidden_size", "dtype_bytes",
    )
} | {"seed"}
NUMBER_KEYS = {k for k in dotted_keys() if k not in CHOICE_KEYS | STRING_KEYS | FLAG_KEYS | LIST_KEYS | COUNT_KEYS}


def hydra_value(value) -> str:
    """``value`` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def as_config(pairs: list[tuple[str, object]]) -> dict:
    return merged(*(nested(k, v) for k, v in pairs))


def both(cls: str, name: str, pairs: list[tuple[str, object]], expect: tuple[str, ...], files=None,
         codes=(BAD_INPUT,)) -> list[Case]:
    """The same bad input through the command line and the API."""
    args = [f"{k}={hydra_value(v)}" for k, v in pairs]
    files = files or {}
    return [
        Case(cls, "cli", name, args=args, files=files, expect=expect, codes=codes),
        Case(cls, "api", name, config=as_config(pairs), files=files, expect=expect, codes=codes),
    ]


NOT_NUMBERS = ["abc", True, [1, 2], {"a": 1}, "", "1e3x", [], "12 ms"]
NOT_STRINGS = [[1, 2], {"a": 1}, 5, 2.5, True, ""]
NOT_FLAGS = ["abc", 1, 0, 2.5, [True], {"a": 1}, "yes"]
NOT_CHOICES = ["nonexistent", 1, 2.5, [1], {"a": 1}, True, "", "VLLM "]
API_ONLY_VALUES = [b"12", {1, 2}, (1, 2), complex(1, 1), Decimal("5"), np.array([3]), object(), Ellipsis]


def types_cases(rng: random.Random) -> list[Case]:
    cases = []
    for key in dotted_keys():
        if key in CHOICE_KEYS:
            bad = NOT_CHOICES
        elif key in STRING_KEYS:
            bad = NOT_STRINGS
        elif key in FLAG_KEYS:
            bad = NOT_FLAGS
        elif key in LIST_KEYS:
            bad = BAD_LISTS[key]
        else:
            bad = NOT_NUMBERS
        for value in bad:
            cases += both("types", f"{key}={value!r}", [(key, value)], (key,))
        api_value = rng.choice(API_ONLY_VALUES)
        cases.append(Case("types", "api", f"{key}={api_value!r}", config=nested(key, api_value), expect=(key,)))
    return cases


HUGE = [2**63, 2**64, 10**400, -(2**63) - 1]


def magnitude_cases(rng: random.Random) -> list[Case]:
    cases = []
    for key in sorted(COUNT_KEYS):
        minimum = 0 if key in ("seed", "workload.prefix_tokens") else 1
        values = [minimum - 1, -(2**63), 1.5, 1e300, math.nan, math.inf, -math.inf, *HUGE]
        if key == "engine.aggregated.num_blocks":
            values.append(2**62)  # num_blocks x block_size beyond int64
        for value in values:
            cases += both("magnitudes", f"{key}={value!r}", [(key, value)], (key,))
    for key in sorted(NUMBER_KEYS):
        values = [-1.0, -1e-300, math.nan, math.inf, -math.inf, -1e300, 10**400]
        if key in ("load.request_rate", "load.burstiness", "load.speedup", "engine.kv_transfer.bandwidth_gb_per_second",
                   "timing.allreduce.bandwidth_gb_per_second") or key.startswith("metrics.goodput"):
            values.append(0.0)
        if not key.startswith("metrics.goodput") and key != "timing.memory_fraction":
            values.append(1e300)
        if key == "timing.memory_fraction":
            values += [1.5, 0.0]
        # an all-reduce key alone is refused as a whole (it needs timing.tp >= 2)
        expect = (key, "timing.allreduce") if key.startswith("timing.allreduce.") else (key,)
        for value in values:
            cases += both("magnitudes", f"{key}={value!r}", [(key, value)], expect)
    # worst-case instants and buffers reached only by products of valid values
    products = [
        [("workload.num_requests", 10**12), ("workload.output_tokens", 10**9)],
        [("workload.output_tokens", 4611686018427387904), ("workload.num_requests", 16)],
        [("workload.input_tokens", 2**62), ("engine.aggregated.num_blocks", 2**40)],
        [("load.type", "poisson"), ("load.request_rate", 1e-300)],
        [("load.type", "constant_rate"), ("load.request_rate", 1e-12), ("workload.num_requests", 10**6)],
        [("load.think_time_ms", 1e15), ("workload.num_requests", 10**6)],
        [("timing.base_ms", 1e9), ("workload.output_tokens", 10**6), ("workload.num_requests", 10**6)],
        [("detokenization.per_output_us", 1e12), ("workload.output_tokens", 10**6)],
        [("tokenization.per_input_us", 1e15), ("workload.input_tokens", 10**6)],
        [("max_time_ms", 1e300)],
        [("engine.aggregated.replicas", 2**40), ("engine.aggregated.attention_dp", 2**40)],
        [("detokenization.workers", 2**50), ("detokenization.base_ms", 1.0)],
        [("tokenization.workers", 2**50), ("tokenization.base_ms", 1.0)],
        [("engine.aggregated.max_sequences", 2**60), ("engine.aggregated.num_blocks", 2**58)],
        [("engine.mode", "disaggregated"), ("engine.kv_transfer.bandwidth_gb_per_second", 1e-300),
         ("engine.kv_transfer.bytes_per_token", 1e300)],
        [("workload.output_dist", "normal"), ("workload.output_std", 1e300)],
        [("workload.input_dist", "lognormal"), ("workload.input_std", 1e18)],
        [("output.mode", "bounded"), ("workload.num_requests", 10**15)],
    ]
    for pairs in products:
        keys = tuple(k for k, _ in pairs)
        cases += both("magnitudes", " ".join(f"{k}={v!r}" for k, v in pairs), pairs, keys)
    # random magnitudes of random count keys, pairwise
    counts = sorted(COUNT_KEYS - {"seed"})
    for _ in range(40):
        a, b = rng.sample(counts, 2)
        pairs = [(a, rng.choice(HUGE + [0, -5])), (b, rng.choice([2**62, 2**63 - 1, 10**30]))]
        cases += both("magnitudes", f"{a} {b}", pairs, (a, b))
    return cases


def valid_other(key: str, rng: random.Random):
    """A valid non-default value of ``key`` (for keys set where they have no effect)."""
    default = default_of(key)
    if key in FLAG_KEYS:
        return not default
    if key in ("workload.path", "timing.profile", "timing.model", "timing.gpu", "timing.backend_version",
               "timing.allreduce.curve"):
        return "x.csv" if key == "workload.path" else "x"
    if key == "timing.backend":
        return "sglang"
    if key in ("workload.input_dist", "workload.output_dist"):
        return "uniform"
    if key == "workload.range_ratio":
        return 0.5
    if key == "timing.memory_fraction":
        return 0.5
    if key == "timing.roofline.kv_dtype":
        return "fp8"
    if key.startswith("timing.roofline."):
        return 0.5
    if key == "engine.aggregated.num_blocks" or key.endswith(".num_blocks"):
        return rng.choice([1000, 2000])
    if key.endswith("schedule_conservativeness"):
        return 0.5
    if key in COUNT_KEYS:
        return (default or 4) + rng.randint(1, 3)
    if isinstance(default, str):  # a name: another of those the key's declaration allows
        return next(name for name in choices_of(key) if name != default)
    if isinstance(default, dict) and key.endswith(".kv_offload"):
        return {"num_blocks": 100, "bandwidth_gb_per_second": 1.0, "bytes_per_token": 1024.0}
    return (default or 1.0) * 2 + rng.choice([0.5, 1.5])


def choices_of(key: str) -> list[str]:
    """The names a choice key allows, as its declaration documents them (``simcore.checks.describe``)."""
    from simcore.checks import describe
    from simcore.settings import SimConfig

    values = next(doc.values for doc in describe(SimConfig) if doc.path == key)
    return [name.strip() for name in values.split("|")]


VALID_TABLE = b"request_id,input_tokens,output_tokens\na,8,2\nb,8,2\n"
#: Bases where a scope's keys do not apply (the default config, or another load/source/timing).
BASES = [
    [],
    [("load.type", "poisson"), ("load.request_rate", 10.0)],
    [("timing.type", "fixed")],
    [("workload.source", "table"), ("workload.path", "t.csv"), ("workload.num_requests", None)],
    [("engine.mode", "disaggregated")],
    [("load.type", "trace"), ("workload.source", "table"), ("workload.path", "t.csv"), ("workload.num_requests", None)],
]


def combination_cases(rng: random.Random) -> list[Case]:
    from simcore.config import load_config

    cases = []
    for scope in KEY_SCOPES:
        for leaf in scope.keys:
            key = f"{scope.section}.{leaf}"
            for base in BASES:
                value = valid_other(key, rng)
                pairs = base + [(key, value)]
                files = {"t.csv": VALID_TABLE}
                cwd = os.getcwd()
                with tempfile.TemporaryDirectory() as tmp:  # keep only the bases where it has no effect
                    Path(tmp, "t.csv").write_bytes(VALID_TABLE)
                    os.chdir(tmp)
                    try:
                        cfg = load_config(as_config(base))
                    except Exception:
                        continue
                    finally:
                        os.chdir(cwd)
                if scope.applies(cfg):
                    continue
                cases += both("combinations", " ".join(f"{k}={v!r}" for k, v in pairs), pairs, (key,), files)
    incompatible = [
        ([("output.mode", "bounded"), ("output.tokens", True)], ("output.tokens",)),
        ([("engine.mode", "disaggregated"), ("engine.kv_transfer.bandwidth_gb_per_second", 10.0)],
         ("engine.kv_transfer",)),
        ([("workload.source", "table")], ("workload.path",)),
        ([("workload.source", "mooncake")], ("workload.path",)),
        ([("workload.num_requests", None)], ("workload.num_requests",)),
        ([("load.type", "poisson")], ("load.request_rate",)),
        ([("load.type", "gamma")], ("load.request_rate",)),
        ([("workload.input_dist", "normal")], ("workload.input_std",)),
        ([("workload.output_dist", "lognormal")], ("workload.output_std",)),
        ([("workload.input_dist", "uniform"), ("workload.range_ratio", 0.0001)], ("workload.range_ratio",)),
        ([("engine.policy", "sglang"), ("engine.aggregated.async_scheduling", True)], ("async_scheduling",)),
        ([("engine.mode", "disaggregated"), ("engine.decode.prefix_caching", True)], ("prefix_caching",)),
        ([("engine.policy", "vllm"), ("engine.aggregated.chunked_prefill_size", 512)], ("chunked_prefill_size",)),
        ([("timing.type", "aic")], ("timing.model", "timing.gpu")),
        ([("timing.type", "roofline")], ("timing.model", "timing.gpu")),
        ([("timing.type", "roofline"), ("timing.model", "llama-70b"), ("timing.gpu", "H200")], ("timing.model",)),
        ([("timing.type", "roofline"), ("timing.model", "llama-3.1-70b"), ("timing.gpu", "RTX4090")],
         ("timing.model", "does not fit")),
        ([("timing.type", "table")], ("timing.profile",)),
        ([("engine.aggregated.num_blocks", "auto")], ("num_blocks",)),
        ([("load.type", "trace")], ("send_ms", "load.type", "trace")),
    ]
    for pairs, expect in incompatible:
        cases += both("combinations", " ".join(f"{k}={v!r}" for k, v in pairs), pairs, expect)
    return cases


# ---------------------------------------------------------------- trace files


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def trace_cases(rng: random.Random) -> list[Case]:
    cases: list[Case] = []

    def table_case(name: str, file: str, data: bytes, expect: tuple[str, ...], trace: bool = False, extra=()):
        pairs = [("workload.source", "table"), ("workload.path", file), ("workload.num_requests", None), *extra]
        if trace:
            pairs.append(("load.type", "trace"))
        cases.extend(both("traces", name, pairs, expect, files={file: data}))
        if file.endswith(".parquet"):  # the same table passed to simcore.run
            cfg = as_config([("load.type", "trace")] if trace else [])
            cases.append(Case("traces", "api", f"requests= {name}", config=cfg, requests_file=file,
                              files={file: data}, expect=("requests",)))

    header = "request_id,input_tokens,output_tokens,send_ms\n"
    good = ["r0,8,2,0", "r1,9,3,1.5", "r2,7,2,3"]
    bad_fields = {
        "input_tokens": ["0", "-3", "1.5", "1e30", "9223372036854775808", "abc", "", "NA", "nan", "inf", "true", "0x10"],
        "output_tokens": ["0", "-1", "2.5", "18446744073709551616", "x", "", "None"],
        "send_ms": ["abc", "nan", "inf", "-inf", "", "1e400", "1e300"],
    }
    for column, values in bad_fields.items():
        for value in values:
            for row in range(3):
                lines = [line.split(",") for line in good]
                index = ["request_id", "input_tokens", "output_tokens", "send_ms"].index(column)
                lines[row][index] = value
                text = header + "\n".join(",".join(line) for line in lines) + "\n"
                expect = (f"t.csv:{row + 2}", f"line {row + 2}")
                if column == "send_ms" and value == "1e300":
                    expect = ("t.csv", "load.speedup", "send_ms")
                table_case(f"csv {column}={value!r} row {row}", "t.csv", text.encode(), expect,
                           trace=column == "send_ms")
    structural = {
        "empty": b"",
        "header only": header.encode(),
        "duplicate header": b"request_id,input_tokens,input_tokens,output_tokens\na,1,1,1\n",
        "duplicate header case": b"input_tokens,output_tokens,output_tokens\n1,1,1\n",
        "missing column": b"request_id,input_tokens\na,5\n",
        "unknown column": b"request_id,input_tokens,output_tokens,colour\na,5,1,red\n",
        "short row": (header + "r0,8\n").encode(),
        "long row": (header + "r0,8,2,0,9\n").encode(),
        "duplicate id": (header + "r0,8,2,0\nr0,8,2,1\n").encode(),
        "binary": bytes(rng.getrandbits(8) for _ in range(512)),
        "nul bytes": header.encode() + b"r0,8\x00,2,0\n",
        "latin-1": header.encode() + "r\xe9,8,2,0\n".encode("latin-1"),
        "bad utf-8 line 3": (header + "r0,8,2,0\n").encode() + b"r\xff\xfe,8,2,0\n",
        "utf-16": header.encode("utf-16"),
        "unterminated quote": (header + '"r0,8,2,0\n').encode(),
        "only newlines": b"\n\n\n",
        "bom header": b"\xef\xbb\xbf" + header.encode() + b"r0,0,2,0\n",
        "decreasing send": (header + "r0,8,2,5\nr1,8,2,1\n").encode(),
    }
    for name, data in structural.items():
        trace = name in ("decreasing send",)
        expect = ("t.csv",)
        if name == "decreasing send":
            expect = ("t.csv", "send_ms")
        table_case(f"csv {name}", "t.csv", data, expect, trace=trace)
    table_case("no suffix", "t.txt", VALID_TABLE, ("t.txt",))
    table_case("missing file", "t.csv", b"", ("nothere.csv",), extra=[("workload.path", "nothere.csv")])
    # Parquet: column types
    ids = pa.array(["a", "b", "c"])
    ints = pa.array([8, 9, 7], pa.int64())
    bad_columns = {
        "strings": pa.array(["8", "9", "7"]),
        "bools": pa.array([True, True, False]),
        "decimals": pa.array([Decimal("8"), Decimal("9"), Decimal("7")], pa.decimal128(5, 0)),
        "lists": pa.array([[8], [9], [7]]),
        "structs": pa.array([{"x": 8}, {"x": 9}, {"x": 7}]),
        "floats 1e30": pa.array([8.0, 1e30, 7.0]),
        "floats 2^63": pa.array([8.0, 2.0**63, 7.0]),
        "uint64 2^63": pa.array([8, 2**63, 7], pa.uint64()),
        "float fraction": pa.array([8.0, 8.5, 7.0]),
        "nan": pa.array([8.0, math.nan, 7.0]),
        "nulls": pa.array([8, None, 7], pa.int64()),
        "zero": pa.array([8, 0, 7], pa.int64()),
        "negative": pa.array([8, -1, 7], pa.int32()),
        "dictionary": pa.array(["8", "9", "7"]).dictionary_encode(),
        "binary": pa.array([b"8", b"9", b"7"]),
        "timestamps": pa.array([1, 2, 3], pa.timestamp("s")),
    }
    for column in ("input_tokens", "output_tokens"):
        for name, values in bad_columns.items():
            cols = {"request_id": ids, "input_tokens": ints, "output_tokens": ints, column: values}
            table_case(f"parquet {column} {name}", "t.parquet", parquet_bytes(pa.table(cols)), ("t.parquet", column))
    bad_send = {
        "strings": pa.array(["0", "1", "2"]),
        "bools": pa.array([False, True, True]),
        "nan": pa.array([0.0, math.nan, 2.0]),
        "inf": pa.array([0.0, math.inf, 2.0]),
        "nulls": pa.array([0.0, None, 2.0]),
        "decreasing": pa.array([0.0, 5.0, 2.0]),
        "lists": pa.array([[0.0], [1.0], [2.0]]),
        "timestamp ns span": pa.array([-(2**63) + 1, 0, 2**63 - 1], pa.timestamp("ns")),
        "duration s huge": pa.array([0, 10**11, 10**12], pa.duration("s")),
        "timestamp s huge": pa.array([0, 10**11, 10**12], pa.timestamp("s")),
        "date32": pa.array([0, 1, 2], pa.date32()),
        "time64": pa.array([0, 1, 2], pa.time64("us")),
        "float 1e300": pa.array([0.0, 1.0, 1e300]),
        "decimal": pa.array([Decimal("0"), Decimal("1"), Decimal("2")], pa.decimal128(5, 0)),
    }
    for name, values in bad_send.items():
        cols = {"request_id": ids, "input_tokens": ints, "output_tokens": ints, "send_ms": values}
        table_case(f"parquet send_ms {name}", "t.parquet", parquet_bytes(pa.table(cols)), ("t.parquet", "send_ms"),
                   trace=True)
    for name, cols in {
        "id floats": {"request_id": pa.array([1.5, 2.5, 3.5]), "input_tokens": ints, "output_tokens": ints},
        "id nulls": {"request_id": pa.array(["a", None, "c"]), "input_tokens": ints, "output_tokens": ints},
        "id duplicate": {"request_id": pa.array(["a", "a", "c"]), "input_tokens": ints, "output_tokens": ints},
        "id lists": {"request_id": pa.array([["a"], ["b"], ["c"]]), "input_tokens": ints, "output_tokens": ints},
        "no rows": {"request_id": pa.array([], pa.string()), "input_tokens": pa.array([], pa.int64()),
                    "output_tokens": pa.array([], pa.int64())},
        "extra column": {"request_id": ids, "input_tokens": ints, "output_tokens": ints, "x": ints},
        "missing output": {"request_id": ids, "input_tokens": ints},
    }.items():
        table_case(f"parquet {name}", "t.parquet", parquet_bytes(pa.table(cols)), ("t.parquet", "request_id",
                                                                                    "output_tokens", "x", "rows"))
    good_pq = parquet_bytes(pa.table({"request_id": ids, "input_tokens": ints, "output_tokens": ints}))
    for name, data in {
        "truncated": good_pq[: len(good_pq) // 2],
        "garbage": bytes(rng.getrandbits(8) for _ in range(300)),
        "flipped footer": good_pq[:-12] + bytes(8) + good_pq[-4:],
        "empty": b"",
        "csv named parquet": VALID_TABLE,
    }.items():
        table_case(f"parquet {name}", "t.parquet", data, ("t.parquet",))
    # Mooncake JSONL
    def mooncake(lines: list[str]) -> bytes:
        return ("\n".join(lines) + "\n").encode()

    ok = '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0]}'
    bad_rows = [
        '{"timestamp": 0, "input_length": 0, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": 8.5, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": 1e30, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": 9223372036854775808, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": "8", "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": true, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": 8, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": "abc"}',
        '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0], "input_tokens": 8}',
        '{"timestamp": "x", "input_length": 8, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 1e300, "input_length": 8, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": -5, "input_length": 8, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": NaN, "input_length": 8, "output_length": 2, "hash_ids": [0]}',
        '{"timestamp": 0, "input_length": 8000, "output_length": 2, "hash_ids": [0]}',
        'not json',
        '[1, 2, 3]',
        '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0]',
        '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0], "request_id": 5}',
        '{"timestamp": 0, "input_length": -9223372036854775809, "output_length": 2, "hash_ids": [0]}',
    ]
    for bad in bad_rows:
        for row in (0, 2):
            lines = [ok.replace('"timestamp": 0', f'"timestamp": {i}') for i in range(3)]
            lines[row] = bad
            if '"timestamp": -5' in bad and row == 0:
                continue  # a first row before the others is valid: the trace is shifted to t = 0
            # a request_id on one row only: the rows without one are named
            expect = ("m.jsonl:",) if '"request_id": 5' in bad else (f"m.jsonl:{row + 1}",)
            cases.extend(both("traces", f"mooncake row {row}: {bad[:50]}",
                              [("workload.source", "mooncake"), ("workload.path", "m.jsonl"),
                               ("workload.num_requests", None), ("load.type", "trace")],
                              expect, files={"m.jsonl": mooncake(lines)}))
    for name, data in {"empty": b"", "binary": bytes(rng.getrandbits(8) for _ in range(400)),
                       "bad utf-8": mooncake([ok]) + b'{"timestamp": 1, "in\xff": 3}\n',
                       "duplicate request_id": mooncake([ok[:-1] + ', "request_id": "a"}'] * 2)}.items():
        cases.extend(both("traces", f"mooncake {name}",
                          [("workload.source", "mooncake"), ("workload.path", "m.jsonl"), ("workload.num_requests", None)],
                          ("m.jsonl",), files={"m.jsonl": data}))
    # Azure CSV
    azure_header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    azure_ok = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109"]
    for bad in ["2023-13-45 99:99:99,374,44", "yesterday,374,44", "2023-11-16 18:15:51.0,0,44",
                "2023-11-16 18:15:51.0,3.5,44", "2023-11-16 18:15:51.0,374,-1", "2023-11-16 18:15:51.0,374",
                "2023-11-16 18:15:51.0,1e30,44", "2023-11-16 18:15:51.0,374,99999999999999999999",
                "2023-11-16 18:15:40.0,374,44", ",374,44"]:
        lines = azure_ok + [bad]
        cases.extend(both("traces", f"azure {bad}",
                          [("workload.source", "azure"), ("workload.path", "a.csv"), ("workload.num_requests", None),
                           ("load.type", "trace")],
                          ("a.csv:4",), files={"a.csv": (azure_header + "\n".join(lines) + "\n").encode()}))
    for name, data in {"empty": b"", "duplicate header": b"TIMESTAMP,TIMESTAMP,ContextTokens,GeneratedTokens\n",
                       "wrong header": b"a,b,c\n1,2,3\n", "binary": bytes(rng.getrandbits(8) for _ in range(400)),
                       "bad utf-8": azure_header.encode() + b"2023-11-16 18:15:46.68\xff,374,44\n"}.items():
        cases.extend(both("traces", f"azure {name}",
                          [("workload.source", "azure"), ("workload.path", "a.csv"), ("workload.num_requests", None)],
                          ("a.csv",), files={"a.csv": data}))
    return cases


# ---------------------------------------------------------------- Hydra syntax


def hydra_cases(rng: random.Random) -> list[Case]:
    raw = [
        (["workload.num_requests="], ("workload.num_requests",)),
        (["=5"], ("=5",)),
        (["workload.num_requests==5"], ("workload.num_requests",)),
        (["workload.num_requests"], ("workload.num_requests",)),
        (["workload"], ("workload",)),
        (["workload.num_requests=[1,2"], ("workload.num_requests",)),
        (["workload.num_requests={a:"], ("workload.num_requests",)),
        (["workload.num_requests='unterminated"], ("workload.num_requests",)),
        (["workload.num_requests=${oops"], ("workload.num_requests",)),
        (["workload.num_requests=${nonexistent.key}"], ("workload.num_requests", "nonexistent")),
        (["workload.num_requests=${load}"], ("workload.num_requests",)),
        (["workload.num_requests=${oc.env:NO_SUCH_VARIABLE_X}"], ("workload.num_requests", "NO_SUCH_VARIABLE_X")),
        (["workload.num_requests=${oc.decode:'[1'}"], ("workload.num_requests",)),
        (["workload.num_requests=${no_such_resolver:1}"], ("workload.num_requests", "no_such_resolver")),
        (["workload.path=${sample:no_such_file.csv}", "workload.source=table"], ("no_such_file", "workload.path")),
        (["+workload.num_requests=5"], ("workload.num_requests",)),
        (["+new_key=1"], ("new_key",)),
        (["++nested.new.key=1"], ("nested",)),
        (["engine=nonexistent_preset"], ("engine", "nonexistent_preset")),
        (["workload=nonexistent_preset"], ("workload", "nonexistent_preset")),
        (["hydra/launcher=nope"], ("hydra/launcher", "nope")),
        (["nosuchgroup=x"], ("nosuchgroup",)),
        (["--config-name=nope"], ("nope",)),
        (["--config-dir=/nonexistent_dir_x"], ("/nonexistent_dir_x",)),
        (["-m", "load.concurrency=range("], ("load.concurrency",)),
        (["-m", "load.concurrency=choice()"], ("load.concurrency",)),
        (["-m", "load.concurrency=range(1,5,0)"], ("load.concurrency",)),
        (["-m", "load.concurrency=interval(1,2)"], ("load.concurrency",)),
        (["load.concurrency=1,2"], ("load.concurrency",)),
        (["load.concurrency=range(1,3)"], ("load.concurrency",)),
        (["load.concurrency=glob(*)"], ("load.concurrency",)),
        (["sweep.batch.load.concurrency=5"], ("sweep.batch.load.concurrency",)),
        (["sweep.batch.load.concurrency=[]"], ("sweep.batch.load.concurrency",)),
        (["sweep.batch.load.nope=[1,2]"], ("sweep.batch.load.nope", "load.nope")),
        (["sweep.batch.load.concurrency=[1,-2]"], ("load.concurrency",)),
        (["sweep.batch.output.dir=[a,b]"], ("sweep.batch.output.dir", "output.dir")),
        (["workload.num_requests=1 2"], ("workload.num_requests",)),
        (["wörkload.num_requests=5"], ("wörkload",)),
        (["workload.num_requests=\x01"], ("workload.num_requests",)),
        (["workload.num_requests=5\\"], ("workload.num_requests",)),
        (["workload..num_requests=5"], ("workload..num_requests",)),
        (["workload.num_requests.x=5"], ("workload.num_requests",)),
        (["Workload.num_requests=5"], ("Workload",)),
        (["hydra.run.dir=${nope}"], ("hydra.run.dir", "nope")),
        (["hydra.job.chdir=maybe"], ("hydra.job.chdir",)),
        (["hydra.sweeper.params.x=1"], ("x",)),
        (["export.nope=1"], ("export.nope",)),
        (["force=maybe"], ("force",)),
        (["workload.num_requests=4", "-m", "load.concurrency=1,2"], ("load.concurrency=1,2",)),
        (["--no-such-flag"], ("--no-such-flag",)),
        (["--cfg", "nope"], ("--cfg", "nope")),
    ]
    cases = [Case("hydra", "cli", " ".join(args), args=args, expect=expect) for args, expect in raw]
    keys = dotted_keys()
    junk = "=[]{}(),'\"$:\\ ~+@#%^&*!?<>|`"
    for _ in range(160):
        key = rng.choice(keys)
        text = "".join(rng.choice(junk + "abc123") for _ in range(rng.randint(1, 8)))
        if not any(ch in text for ch in "[]{}()'\"$\\=,~@#%^&*!?<>|` :"):
            text += "${"
        cases.append(Case("hydra", "cli", f"{key}={text!r}", args=[f"{key}={text}"], expect=(key,)))
    return cases


# ---------------------------------------------------------------- environment


def environment_cases(ro: Path | None, full: Path | None) -> list[Case]:
    cases = [
        Case("environment", "cli", "output.dir is a file", args=["output.dir=f", "workload.num_requests=4"],
             files={"f": b"x"}, expect=("f",), codes=(ENVIRONMENT,)),
        Case("environment", "cli", "output.dir below a file", args=["output.dir=f/sub", "workload.num_requests=4"],
             files={"f": b"x"}, expect=("f",), codes=(ENVIRONMENT,)),
        Case("environment", "cli", "output.dir in /proc", args=["output.dir=/proc/replaysim_x",
                                                                  "workload.num_requests=4"],
             expect=("/proc",), codes=(ENVIRONMENT,)),
        Case("environment", "cli", "output.dir name too long", args=[f"output.dir={'d' * 300}",
                                                                       "workload.num_requests=4"],
             expect=("d" * 50,), codes=(ENVIRONMENT,)),
        Case("environment", "cli", "workload.path is a directory",
             args=["workload.source=table", "workload.path=.", "workload.num_requests=null"], expect=("workload.path",)),
        Case("environment", "cli", "workload.path a dangling symlink",
             args=["workload.source=table", "workload.path=link.csv", "workload.num_requests=null"],
             expect=("link.csv",)),
        Case("environment", "cli", "workload.path a fifo",
             args=["workload.source=table", "workload.path=fifo.csv", "workload.num_requests=null"],
             expect=("fifo.csv",)),
        Case("environment", "cli", "timing.profile missing", args=["timing.type=table", "timing.profile=nodir"],
             expect=("nodir", "timing.profile")),
        Case("environment", "cli", "--config-dir a file", args=["--config-dir=f", "workload.num_requests=4"],
             files={"f": b"x"}, expect=("f",)),
        Case("environment", "api", "workload.path a directory",
             config=as_config([("workload.source", "table"), ("workload.path", "."), ("workload.num_requests", None)]),
             expect=("workload.path",)),
        Case("environment", "api", "workload.path with a NUL byte",
             config=as_config([("workload.source", "table"), ("workload.path", "a\x00b.csv"),
                               ("workload.num_requests", None)]), expect=("workload.path",)),
        Case("environment", "api", "workload.path a fifo",
             config=as_config([("workload.source", "table"), ("workload.path", "fifo.csv"),
                               ("workload.num_requests", None)]), expect=("fifo.csv",)),
    ]
    for index in range(2):
        if ro is not None:
            cases.append(Case("environment", "cli", f"read-only output.dir {index}",
                              args=[f"output.dir={ro}/out{index}", "workload.num_requests=4"], expect=(str(ro),),
                              codes=(ENVIRONMENT,)))
        if full is not None:
            cases.append(Case("environment", "cli", f"full disk {index}",
                              args=[f"output.dir={full}/out{index}", "workload.num_requests=4"], expect=(str(full),),
                              codes=(ENVIRONMENT,)))
    if full is not None:  # room for the probe, not for the results
        cases.append(Case("environment", "cli", "disk fills while writing",
                          args=[f"output.dir={full}/../fillup/out", "workload.num_requests=20000", "output.tokens=true"],
                          expect=("fillup",), codes=(ENVIRONMENT,)))
    return cases


def mount_tmpfs(path: Path, size: str, readonly: bool = False) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if readonly else "")
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def fill(path: Path) -> None:
    """Write ``path`` until its file system has no block left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- running


def snapshot(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")} if directory.exists() else set()


def prepare_dir(case: Case, base: Path, index: int) -> Path:
    work = base / f"case{index}"
    work.mkdir()
    for name, data in case.files.items():
        (work / name).write_bytes(data)
    if case.cls == "environment":
        if "link.csv" in case.name:
            os.symlink(work / "gone.csv", work / "link.csv")
        if "fifo" in case.name:
            os.mkfifo(work / "fifo.csv")
    return work


def judge(case: Case, code: int | None, message: str, stderr: str, new_files: set[str]) -> str | None:
    """Why the case is not a clean rejection, or None."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if code is None:
        return "timed out"
    if code not in case.codes:
        return f"exit {code}, expected {case.codes}; stderr: {stderr.strip()[-300:]!r}"
    if "Traceback" in stderr:
        return "traceback on stderr"
    if len(lines) != 1:
        return f"{len(lines)} stderr lines: {stderr.strip()[:400]!r}"
    if case.via == "cli" and not lines[0].startswith("replaysim: error: "):
        return f"stderr is not 'replaysim: error: ...': {lines[0][:200]!r}"
    named = [token for token in case.expect if token in message]
    # a product of keys may be named by their leaves (``replicas=1 x attention_dp=2``)
    named += [t for t in case.expect if "." in t and f"{t.rsplit('.', 1)[-1]}=" in message]
    if not named:
        return f"message names none of {case.expect}: {message[:300]!r}"
    if new_files:
        return f"files written: {sorted(new_files)[:5]}"
    return None


def run_cli(case: Case, base: Path, index: int, env: dict) -> tuple[Case, str | None]:
    work = prepare_dir(case, base, index)
    before = snapshot(work)
    try:
        proc = subprocess.run([shutil.which("replaysim"), *case.args], cwd=work, env=env, capture_output=True,
                              text=True, errors="replace", timeout=TIMEOUT_S)
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, stderr = None, (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
    new = snapshot(work) - before
    verdict = judge(case, code, stderr, stderr, new)
    shutil.rmtree(work, ignore_errors=True)
    return case, verdict


def api_worker(batch_file: str) -> None:
    """Run pickled API cases in this process; print one JSON verdict line each."""
    import simcore
    from simcore import ConfigError

    cases: list[tuple[int, Case, str]] = pickle.loads(Path(batch_file).read_bytes())
    for index, case, work in cases:
        os.chdir(work)
        before = snapshot(Path(work))
        try:
            requests = pq.read_table(case.requests_file) if case.requests_file else None
        except Exception as exc:  # the case's own table cannot be read back: not a replaysim defect
            print(json.dumps([index, f"skip: {exc}"]), flush=True)
            continue
        try:
            simcore.run(case.config, requests=requests)
            code, message = 0, ""
        except ConfigError as exc:
            code, message = BAD_INPUT, str(exc)
        except Exception as exc:  # noqa: BLE001 - every other exception is the defect looked for
            code, message = 1, f"{type(exc).__name__}: {exc}"
        new = snapshot(Path(work)) - before
        if code == 1:
            verdict = f"raised {message[:300]}"
        else:
            verdict = judge(case, code, message, message if code == BAD_INPUT else "", new)
        print(json.dumps([index, verdict]), flush=True)


def run_api_batch(batch: list[tuple[int, Case]], base: Path, env: dict) -> list[tuple[Case, str | None]]:
    works = [(index, case, str(prepare_dir(case, base, index))) for index, case in batch]
    batch_file = base / f"batch{batch[0][0]}.pkl"
    batch_file.write_bytes(pickle.dumps(works))
    proc = subprocess.run([sys.executable, __file__, "--api-worker", str(batch_file)], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S * len(batch))
    verdicts = {}
    for line in proc.stdout.splitlines():
        try:
            index, verdict = json.loads(line)
        except ValueError:
            continue
        verdicts[index] = verdict
    out = []
    for index, case, work in works:
        if index not in verdicts:  # the worker died on this case (or before it)
            if len(batch) > 1:
                return out + [
                    r for i, c in batch if i not in verdicts for r in run_api_batch([(i, c)], base, env)
                ]
            verdicts[index] = f"worker died (exit {proc.returncode}): {proc.stderr.strip()[-300:]!r}"
        out.append((case, verdicts[index]))
        shutil.rmtree(work, ignore_errors=True)
    return out


def generate(seed: int, ro: Path | None, full: Path | None, classes: tuple[str, ...]) -> list[Case]:
    rng = random.Random(seed)
    makers = {
        "types": lambda: types_cases(rng),
        "magnitudes": lambda: magnitude_cases(rng),
        "combinations": lambda: combination_cases(rng),
        "traces": lambda: trace_cases(rng),
        "hydra": lambda: hydra_cases(rng),
        "environment": lambda: environment_cases(ro, full),
    }
    return [case for cls in CLASSES if cls in classes for case in makers[cls]()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="at most this many cases per class and interface (a random subset)")
    parser.add_argument("--classes", default=",".join(CLASSES))
    parser.add_argument("--via", default="cli,api")
    parser.add_argument("--api-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.api_worker:
        api_worker(args.api_worker)
        return
    base = Path(tempfile.mkdtemp(prefix="replaysim-fuzz-"))
    ro = full = None
    mounts = []
    if os.geteuid() == 0 and "environment" in args.classes:
        if mount_tmpfs(base / "ro", "1m", readonly=True):
            ro = base / "ro"
            mounts.append(ro)
        if mount_tmpfs(base / "full", "64k"):
            full = base / "full"
            mounts.append(full)
            fill(full / "filler")
        if mount_tmpfs(base / "fillup", "256k"):
            mounts.append(base / "fillup")
    cases = generate(args.seed, ro, full, tuple(args.classes.split(",")))
    cases = [c for c in cases if c.via in args.via.split(",")]
    if args.limit:
        rng = random.Random(args.seed)
        by_class: dict[tuple[str, str], list[Case]] = {}
        for case in cases:
            by_class.setdefault((case.cls, case.via), []).append(case)
        cases = [c for group in by_class.values() for c in (rng.sample(group, args.limit)
                                                            if len(group) > args.limit else group)]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = str(ROOT)
    indexed = list(enumerate(cases))
    cli = [(i, c) for i, c in indexed if c.via == "cli"]
    api = [(i, c) for i, c in indexed if c.via == "api"]
    batches = [api[k:k + API_BATCH] for k in range(0, len(api), API_BATCH)]
    results: list[tuple[Case, str | None]] = []
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_api_batch, batch, base, env) for batch in batches]
            futures += [pool.submit(run_cli, case, base, index, env) for index, case in cli]
            for done, future in enumerate(futures, 1):
                result = future.result()
                results.extend(result if isinstance(result, list) else [result])
                if done % 50 == 0:
                    print(f"... {len(results)} of {len(cases)} cases", file=sys.stderr, flush=True)
    finally:
        for mount in mounts:
            subprocess.run(["umount", str(mount)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    skipped = [(c, v) for c, v in results if v and v.startswith("skip:")]
    results = [(c, v) for c, v in results if not (v and v.startswith("skip:"))]
    counts = Counter((c.cls, c.via) for c, _ in results)
    failed = Counter((c.cls, c.via) for c, v in results if v)
    print("class,via,cases,clean,failing")
    for cls in CLASSES:
        for via in ("cli", "api"):
            if counts[cls, via]:
                print(f"{cls},{via},{counts[cls, via]},{counts[cls, via] - failed[cls, via]},{failed[cls, via]}")
    for case, verdict in results:
        if verdict:
            target = " ".join(case.args) if case.via == "cli" else repr(case.config)[:200]
            print(f"FAIL [{case.cls}/{case.via}] {case.name[:120]} :: {target[:200]} :: {verdict}")
    for case, verdict in skipped:
        print(f"SKIP [{case.cls}/{case.via}] {case.name[:120]} :: {verdict}")
    total, bad = len(results), sum(failed.values())
    print(f"{total} bad inputs (seed {args.seed}): {total - bad} clean rejections, {bad} failing")


if __name__ == "__main__":
    main()

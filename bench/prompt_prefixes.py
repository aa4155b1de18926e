"""The shared prompt prefixes of LLMServingSim's measured vLLM runs, as block identities.

    python bench/prompt_prefixes.py derive WORKLOAD.jsonl REQUESTS.jsonl --out PREFIXES.csv
    python bench/prompt_prefixes.py trace PREFIXES.csv REQUESTS.jsonl --out TRACE.jsonl

The runs of ``shared/data/llmservingsim-vllm-bench`` replay LLMServingSim's
``workloads/sharegpt-<model>-300-sps10.jsonl`` (the data set's README), whose
generator (``workloads/generators/sharegpt.py``) makes every turn of a ShareGPT
conversation a request whose prompt is the conversation so far: later turns
begin with the tokens of earlier prompts.  ``requests.jsonl`` keeps only the
lengths, so a replay from it gives every prompt blocks of its own, while the
run's vLLM (prefix caching on) found those shared blocks cached.

``derive`` reads the workload (its ``input_tok_ids``; rows in the order of
``requests.jsonl``, lengths checked row by row) and writes, per request, the
earliest earlier request with which it shares the most leading whole blocks
and how many (``request_id,parent,shared_blocks``; parent -1: none): the
prompts' prefix tree, without their tokens.  ``trace`` turns that file and
``requests.jsonl`` into a Mooncake-format trace at 16-token blocks
(``workload.source=mooncake``, ``workload.block_size=16``, sent at
``arrival_time - arrival_time[0]`` as ``bench/accuracy.py`` sends): equal
``hash_ids`` exactly where the prompts have equal leading blocks.

Bad input exits 2 with one line naming the file and line.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys

BLOCK_SIZE = 16  # the runs' vLLM block size (meta.json cache_config.block_size)


class InputError(Exception):
    """A bad input file: the message names the file and line."""


def shared_prefixes(prompts: list[list[int]], block_size: int = BLOCK_SIZE) -> tuple[list[int], list[int]]:
    """Per prompt, the earliest earlier prompt sharing the most leading whole blocks, and how many.

    Parameters
    ----------
    prompts : list of list of int
        Token ids, in request order.
    block_size : int
        Tokens per block.

    Returns
    -------
    parent, shared : list of int
        ``parent[i]`` (-1: no shared block) and ``shared[i]`` blocks.
    """
    # A trie of whole blocks: (node, block tokens) -> child node; owner: its first prompt.
    children: dict[tuple[int, tuple[int, ...]], int] = {}
    owner = [-1]  # node 0: the empty prefix
    parent, shared = [], []
    for i, ids in enumerate(prompts):
        blocks = [tuple(ids[j:j + block_size]) for j in range(0, len(ids) - block_size + 1, block_size)]
        node, depth = 0, 0
        while depth < len(blocks) and (node, blocks[depth]) in children:
            node = children[(node, blocks[depth])]
            depth += 1
        parent.append(owner[node])
        shared.append(depth)
        for block in blocks[depth:]:
            children[(node, block)] = node = len(owner)
            owner.append(i)
    return parent, shared


def block_hash_ids(input_tokens: list[int], parent: list[int], shared: list[int],
                   block_size: int = BLOCK_SIZE) -> list[list[int]]:
    """One id per block of each prompt (its last, partial one included): a prompt's first
    ``shared`` blocks take its parent's ids, the others new ones."""
    ids: list[list[int]] = []
    fresh = 0
    for i, tokens in enumerate(input_tokens):
        if shared[i] > 0 and not 0 <= parent[i] < i:
            raise ValueError(f"request {i}: parent {parent[i]} is not an earlier request")
        own = -(-tokens // block_size) - shared[i]
        inherited = ids[parent[i]][:shared[i]] if shared[i] > 0 else []
        ids.append(inherited + list(range(fresh, fresh + own)))
        fresh += own
    return ids


def _read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InputError(f"{path}:{line_no}: not JSON ({exc.msg})") from None
    return rows


def _check_lengths(workload: str, rows: list[dict], requests: list[dict]) -> None:
    if len(rows) != len(requests):
        raise InputError(f"{workload}: {len(rows)} rows, the run's requests.jsonl {len(requests)}")
    for line_no, (row, request) in enumerate(zip(rows, requests), 1):
        tokens = row.get("input_tok_ids")
        if not isinstance(tokens, list) or len(tokens) != request["input_toks"]:
            got = len(tokens) if isinstance(tokens, list) else tokens
            raise InputError(f"{workload}:{line_no}: input_tok_ids has {got} tokens, requests.jsonl input_toks "
                             f"{request['input_toks']}")
        if row.get("output_toks") != request["output_toks"]:
            raise InputError(f"{workload}:{line_no}: output_toks {row.get('output_toks')!r}, requests.jsonl "
                             f"{request['output_toks']}")


def derive(workload: str, requests_path: str, out: str) -> str:
    """Write the prefix file of ``workload`` for the run of ``requests_path``; returns a one-line summary."""
    rows, requests = _read_jsonl(workload), _read_jsonl(requests_path)
    _check_lengths(workload, rows, requests)
    parent, shared = shared_prefixes([row["input_tok_ids"] for row in rows])
    with open(out, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["request_id", "parent", "shared_blocks"])
        for request, p, h in zip(requests, parent, shared):
            writer.writerow([request["request_id"], p, h])
    tokens = sum(h * BLOCK_SIZE for h in shared)
    total = sum(r["input_toks"] for r in requests)
    return (f"{sum(h > 0 for h in shared)} of {len(shared)} prompts begin with whole blocks of an earlier one: "
            f"{tokens:,} of {total:,} prompt tokens ({100 * tokens / total:.1f}%)")


def read_prefixes(path: str, requests: list[dict]) -> tuple[list[int], list[int]]:
    """``parent`` and ``shared`` of a prefix file, its request ids checked against ``requests``."""
    parent, shared = [], []
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"request_id", "parent", "shared_blocks"} - set(reader.fieldnames or ())
        if missing:
            raise InputError(f"{path}:1: no column {', '.join(sorted(missing))}")
        for line_no, row in enumerate(reader, 2):
            i = line_no - 2
            if i >= len(requests) or row["request_id"] != requests[i]["request_id"]:
                raise InputError(f"{path}:{line_no}: request_id {row['request_id']!r} is not the run's row {i + 1}")
            try:
                parent.append(int(row["parent"]))
                shared.append(int(row["shared_blocks"]))
            except (TypeError, ValueError):
                raise InputError(f"{path}:{line_no}: parent and shared_blocks must be integers") from None
            p, h = parent[-1], shared[-1]
            if h < 0 or h * BLOCK_SIZE > requests[i]["input_toks"] or h > 0 and not (
                    0 <= p < i and h * BLOCK_SIZE <= requests[p]["input_toks"]):
                raise InputError(f"{path}:{line_no}: {h} shared blocks of parent {p} do not fit row {i + 1}: it has "
                                 f"{requests[i]['input_toks']} prompt tokens, and the parent must be an earlier row "
                                 f"with at least {h * BLOCK_SIZE}")
    if len(parent) != len(requests):
        raise InputError(f"{path}: {len(parent)} rows, the run's requests.jsonl {len(requests)}")
    return parent, shared


def trace(prefixes: str, requests_path: str, out: str) -> None:
    """Write the Mooncake-format trace of the run of ``requests_path`` with the blocks of ``prefixes``."""
    requests = _read_jsonl(requests_path)
    parent, shared = read_prefixes(prefixes, requests)
    ids = block_hash_ids([r["input_toks"] for r in requests], parent, shared)
    first = requests[0]["arrival_time"]
    with open(out, "w", encoding="utf-8") as handle:
        for request, hash_ids in zip(requests, ids):
            handle.write(json.dumps({
                "request_id": request["request_id"], "timestamp": (request["arrival_time"] - first) * 1e3,
                "input_length": request["input_toks"], "output_length": request["output_toks"], "hash_ids": hash_ids,
            }) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, first in (("derive", "workload"), ("trace", "prefixes")):
        command = sub.add_parser(name)
        command.add_argument(first)
        command.add_argument("requests")
        command.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "derive":
            print(derive(args.workload, args.requests, args.out))
        else:
            trace(args.prefixes, args.requests, args.out)
    except (InputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"error: {args.requests}: a row has no {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

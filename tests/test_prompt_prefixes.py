"""bench/prompt_prefixes.py: the prompts' prefix tree and the block ids it gives back."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "prompt_prefixes.py"
_spec = importlib.util.spec_from_file_location("prompt_prefixes", _PATH)
prompt_prefixes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prompt_prefixes)


def test_hand_worked_prefixes_and_ids():
    # Blocks of 2 tokens. B repeats A's two whole blocks, C A's first, D none;
    # E repeats B's three whole blocks: its parent is B (A has only two of them).
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 9, 9, 6], [1, 2, 7, 7], [8, 8], [1, 2, 3, 4, 9, 9, 0, 0]]
    parent, shared = prompt_prefixes.shared_prefixes(prompts, block_size=2)
    assert parent == [-1, 0, 0, -1, 1]
    assert shared == [0, 2, 1, 0, 3]
    ids = prompt_prefixes.block_hash_ids([len(p) for p in prompts], parent, shared, block_size=2)
    # A: 3 blocks (the last partial) 0, 1, 2; B: A's 0, 1, then 3, 4 (9 9 and the partial 6);
    # C: A's 0, then 5; D: 6; E: B's 0, 1, 3, then 7.
    assert ids == [[0, 1, 2], [0, 1, 3, 4], [0, 5], [6], [0, 1, 3, 7]]


def _equal_leading_blocks(p, q, bs):
    j = 0
    while (j + 1) * bs <= min(len(p), len(q)) and p[j * bs:(j + 1) * bs] == q[j * bs:(j + 1) * bs]:
        j += 1
    return j


@pytest.mark.parametrize("seed", range(20))
def test_equal_ids_exactly_where_the_leading_blocks_are_equal(seed):
    rng = np.random.default_rng(seed)
    bs = int(rng.integers(1, 5))
    prompts: list[list[int]] = []
    for _ in range(40):  # turns that extend an earlier prompt, or fresh ones, from a small alphabet
        base = prompts[int(rng.integers(len(prompts)))] if prompts and rng.random() < 0.6 else []
        cut = int(rng.integers(0, len(base) + 1))
        prompts.append(base[:cut] + rng.integers(0, 3, size=int(rng.integers(1, 12))).tolist())
    parent, shared = prompt_prefixes.shared_prefixes(prompts, block_size=bs)
    ids = prompt_prefixes.block_hash_ids([len(p) for p in prompts], parent, shared, block_size=bs)
    for i, p in enumerate(prompts):
        assert len(ids[i]) == -(-len(p) // bs)
        for k, q in enumerate(prompts[:i]):
            for j in range(min(len(p), len(q)) // bs):  # whole blocks of both
                same_prefix = p[:(j + 1) * bs] == q[:(j + 1) * bs]
                assert (ids[i][j] == ids[k][j]) == same_prefix
        if len(p) % bs:  # a partial last block is never anyone else's
            assert sum(ids[i][-1] in other for other in ids) == 1
        # the parent is the earliest prompt with the longest run of equal leading blocks
        runs = [_equal_leading_blocks(p, q, bs) for q in prompts[:i]]
        longest = max(runs, default=0)
        assert shared[i] == longest
        assert parent[i] == (runs.index(longest) if longest else -1)


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_derive_and_trace_files(tmp_path, capsys):
    requests = [{"request_id": f"bench-{i}", "input_toks": n, "output_toks": 3, "arrival_time": 100.0 + i / 4}
                for i, n in enumerate((20, 33, 5))]
    workload = [{"input_tok_ids": list(range(20)), "output_toks": 3},
                {"input_tok_ids": list(range(16)) + [99] * 17, "output_toks": 3},
                {"input_tok_ids": [7] * 5, "output_toks": 3}]
    req_path = _write_jsonl(tmp_path / "requests.jsonl", requests)
    wl_path = _write_jsonl(tmp_path / "workload.jsonl", workload)
    prefixes = str(tmp_path / "prefixes.csv")
    assert prompt_prefixes.main(["derive", wl_path, req_path, "--out", prefixes]) == 0
    assert capsys.readouterr().out.startswith("1 of 3 prompts begin with whole blocks of an earlier one: 16 of 58")
    assert Path(prefixes).read_text() == "request_id,parent,shared_blocks\nbench-0,-1,0\nbench-1,0,1\nbench-2,-1,0\n"
    out = tmp_path / "trace.jsonl"
    assert prompt_prefixes.main(["trace", prefixes, req_path, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["hash_ids"] for r in rows] == [[0, 1], [0, 2, 3], [4]]  # 16-token blocks
    assert [r["timestamp"] for r in rows] == [0.0, 250.0, 500.0]
    assert [(r["input_length"], r["output_length"]) for r in rows] == [(20, 3), (33, 3), (5, 3)]


def test_bad_input_exits_2_naming_file_and_line(tmp_path, capsys):
    requests = [{"request_id": "a", "input_toks": 4, "output_toks": 1, "arrival_time": 0.0},
                {"request_id": "b", "input_toks": 4, "output_toks": 1, "arrival_time": 1.0}]
    req_path = _write_jsonl(tmp_path / "requests.jsonl", requests)
    wl_path = _write_jsonl(tmp_path / "workload.jsonl", [{"input_tok_ids": [1, 2, 3, 4], "output_toks": 1},
                                                        {"input_tok_ids": [1, 2, 3], "output_toks": 1}])
    assert prompt_prefixes.main(["derive", wl_path, req_path, "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {wl_path}:2: input_tok_ids has 3 tokens, requests.jsonl input_toks 4"]
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,parent,shared_blocks\na,-1,0\nb,0,2\n")  # 2 blocks of 16 > 4 tokens
    out = tmp_path / "t.jsonl"
    assert prompt_prefixes.main(["trace", str(bad), req_path, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: {bad}:3: 2 shared blocks of parent 0 do not fit row 2")
    assert not out.exists()

"""bench/specdecode_study.py: the acceptance walk, the EAGLE-3 head's price and the doc splicing (hand-worked)."""

from __future__ import annotations

import csv
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


study = _load("specdecode_study")


def test_walk_k3():
    # Six output tokens; the prefill emits the first.  After 1: acc 3 -> 3 tokens (4 done);
    # after 4: acc[3] = 1 -> 1 (5 done); after 5: acc[4] = 2 -> 2 (7 >= 6, stop).
    assert study.walk([3, 2, 1, 1, 2, 1], 3) == (3, 6)


def test_walk_caps_at_k_plus_one():
    # acc 9 at the start emits k + 1 = 2 with k = 1: after 1 -> 3, acc[2] = 7 -> 2 (5), acc[4] = 5 -> 2 (7).
    assert study.walk([9, 8, 7, 6, 5, 4], 1) == (3, 6)
    # A one-token output never verifies.
    assert study.walk([4], 3) == (0, 0)


def test_eagle3_head_params_by_hand():
    # q, k, v from 2 x 4096 inputs to 4096 + 1024 + 1024; o 4096 x 4096; MLP 3 x 4096 x 14336;
    # fusion 3 x 4096 x 4096; lm_head 32000 x 4096.
    attention = 2 * 4096 * 6144 + 4096 * 4096
    assert attention == 67_108_864
    assert study.eagle3_head_params() == attention + 176_160_768 + 50_331_648 + 131_072_000 == 424_673_280


def test_proposer_cost_by_hand():
    step_ms, per_seq_us = study.proposer_cost(1000.0)
    # bf16 weights once at the H100 SXM's 3,350 GB/s.
    assert step_ms == pytest.approx(2 * 424_673_280 / 3.35e12 * 1e3, rel=1e-12)
    # one layer's KV of 1000 tokens (8 heads x 128 x 2 (k, v) x 2 bytes) at 3,350 GB/s
    # plus 2 x 424,673,280 FLOPs at 989.5 TFLOPS, in us.
    kv_us = 1000 * 8 * 128 * 2 * 2 / 3.35e12 * 1e6
    flops_us = 2 * 424_673_280 / 989.5e12 * 1e6
    assert per_seq_us == pytest.approx(kv_us + flops_us, rel=1e-12)


def test_study_costs_by_hand():
    """predictor.py's Llama8BH100 (SpecDecode-Bench/simulator at 2fdccbd): a drafting step of k = 3
    at 1000 tokens of context per sequence costs 2.13526175 ms + 4 x 0.841429603 us + 1000 x
    2.37768493 ns per sequence; spread over the 3 draft passes the replay charges."""
    step_ms, per_seq_us, overhead_us = study.study_costs(1000.0, 3)
    assert 3 * step_ms == pytest.approx(2.13526175 + 4 * 8.41429603e-4, rel=1e-12)
    assert 3 * per_seq_us == pytest.approx(1000 * 2.37768493e-3, rel=1e-12)
    assert overhead_us == pytest.approx(1206.83946, rel=1e-12)


def test_splice_replaces_or_appends():
    heading = study.SECTION_HEADING
    appended = study.splice("# Doc\n\n## A\n\ntext\n", heading + "\n\nnew\n")
    assert appended == "# Doc\n\n## A\n\ntext\n\n" + heading + "\n\nnew\n"
    replaced = study.splice(f"# Doc\n\n{heading}\n\nold\n\n## B\n\nb\n", heading + "\n\nnew\n")
    assert replaced == f"# Doc\n\n{heading}\n\nnew\n\n## B\n\nb\n"


def test_accuracy_rewrite_keeps_the_section(tmp_path):
    accuracy = _load("accuracy")
    accuracy._TRACES.cleanup()  # the module's own temporary directory, unused here
    assert study.SECTION_HEADING in accuracy.KEPT_SECTIONS
    path = tmp_path / "accuracy.md"
    path.write_text(f"# Old\n\n{study.SECTION_HEADING}\n\nrows\n\n## After\n\nx\n", encoding="utf-8")
    assert accuracy.kept_sections(str(path), "# New\n") == f"# New\n\n{study.SECTION_HEADING}\n\nrows\n"


def test_data_files_consistent():
    data = os.path.join(ROOT, "bench", "data", "specdecode_bench")
    with open(os.path.join(data, "measured_speedup.csv"), encoding="utf-8") as handle:
        measured = list(csv.DictReader(handle))
    # Figure 1: 12 panels of 3 series at 4 batch sizes, plus n-gram k = 5 on the three InstructCoder panels.
    assert len(measured) == 12 * 3 * 4 + 3 * 4
    assert {int(r["batch_size"]) for r in measured} == set(study.BATCH_SIZES)
    with open(os.path.join(data, "requests.csv"), encoding="utf-8") as handle:
        requests = list(csv.DictReader(handle))
    for r in requests:
        for method in ("eagle3", "ngram"):
            for k in (3, 5):
                steps, emitted = int(r[f"{method}_k{k}_verifications"]), int(r[f"{method}_k{k}_emitted"])
                # every verification emits 1..k+1 tokens, and together they cover the output after the first
                assert steps <= emitted <= (k + 1) * steps
                assert emitted >= int(r[f"{method}_output_tokens"]) - 1
            # n-gram: the steps with a match emit 1..k+1 each, those without exactly 1, and the two walks
            # coincide (a step without a match has acceptance 1 in the study's data), so the tokens of the
            # steps without a match are their number
            matched, matched_emitted = int(r[f"ngram_k{k}_matched"]), int(r[f"ngram_k{k}_matched_emitted"])
            total, emitted = int(r[f"ngram_k{k}_verifications"]), int(r[f"ngram_k{k}_emitted"])
            assert 0 <= matched <= total and matched <= matched_emitted <= (k + 1) * matched
            assert emitted - matched_emitted == total - matched


def test_ngram_walk_by_hand():
    # Prompt 5 6 7 8; output 5 6 7 1 2 3 4 (the prefill emits the first, 5).
    # After 1 output token the context ends 7 8 5: no earlier occurrence, a plain step (1 token);
    # after 2 it ends 8 5 6: none, plain; after 3 it ends 5 6 7, which starts the prompt: a match,
    # emitting min(acc[2], k + 1) = 3; after 6 it ends 1 2 3, first seen there: plain; 7 done.
    context = [5, 6, 7, 8, 5, 6, 7, 1, 2, 3, 4]
    assert study.ngram_walk(context, 4, [1, 1, 3, 1, 1, 1, 1], 3) == (1, 3, 3, 0)
    # k = 1 caps the matched step at 2 tokens: after 5 the context ends 7 1 2: none; after 6, 1 2 3: none.
    assert study.ngram_walk(context, 4, [1, 1, 3, 1, 1, 1, 1], 1) == (1, 2, 4, 0)
    # an acceptance above 1 where no match exists is counted as contradicting the rule
    assert study.ngram_walk(context, 4, [2, 1, 3, 1, 1, 1, 1], 3) == (1, 3, 3, 1)
    # a context shorter than prompt_lookup_min, or its very first 3 tokens, never match
    assert study.ngram_walk([1, 1, 1], 1, [3, 1, 1], 3) == (0, 0, 2, 1)

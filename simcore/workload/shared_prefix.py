"""Recurring prompts: the ``shared_prefix`` workload of inference-perf (docs/semantics.md).

inference-perf (kubernetes-sigs/inference-perf,
``inference_perf/datagen/synthetic/shared_prefix_datagen.py``) builds
``num_groups`` random system prompts and, per group, ``num_prompts_per_group``
questions; prompt ``k = g·P + p`` is group g's system prompt followed by its
p-th question.  One seeded permutation of the ``G·P`` prompts is the cycle, and
send i uses entry ``i mod G·P`` of it, so every prompt recurs once a cycle.

No text is made here: a prompt is its lengths and its ``hash_ids``, blocks of
``hash_block_tokens`` tokens as in a Mooncake trace (prefix-chained: equal ids,
equal token prefixes).  The system prompt is one entry, id ``g``; the question
fills the next ``ceil(question_len / hash_block_tokens)`` entries, ids unique to
the prompt.  Prefix caching then finds a prompt's blocks again on its next send,
and the system prompt's whole engine blocks from any prompt of its group.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simcore.config import SharedPrefixConfig
from simcore.workload.table import RequestTable, default_ids

#: The largest offset an Arrow ``list`` (int32 offsets) holds; longer use ``large_list``.
LIST_OFFSET_MAX = 2**31 - 1


def prompt_cycle(cfg: SharedPrefixConfig, rng: np.random.Generator) -> np.ndarray:
    """The order in which the prompts are sent, repeated every ``G·P`` sends.

    Parameters
    ----------
    cfg : SharedPrefixConfig
    rng : numpy.random.Generator
        The run's generator (``cfg.seed`` null), advanced by one permutation.

    Returns
    -------
    ndarray(int64, ndim=1)
        A permutation of the prompt indices ``k = g·P + p``.
    """
    if cfg.seed is not None:  # the prompt set stays fixed while ``seed`` varies the arrivals
        rng = np.random.default_rng(cfg.seed)
    return rng.permutation(cfg.num_prompts).astype(np.int64)


def shared_prefix_requests(cfg: SharedPrefixConfig, num_requests: int, rng: np.random.Generator) -> RequestTable:
    """``num_requests`` sends of the recurring prompts, in cycle order.

    Parameters
    ----------
    cfg : SharedPrefixConfig
    num_requests : int
        Sends (``workload.num_requests``).
    rng : numpy.random.Generator
        Passed to :func:`prompt_cycle`.

    Returns
    -------
    RequestTable
        Default ids, the prompts' lengths and ``hash_ids``, no send times.
    """
    prompt = prompt_cycle(cfg, rng)[np.arange(num_requests, dtype=np.int64) % cfg.num_prompts]
    has_system = cfg.system_prompt_len > 0
    questions = cfg.hash_blocks - has_system  # hash_ids entries of one question
    # Ids 0 .. G-1 are the system prompts; question entries follow, prompt by prompt.
    question_ids = cfg.num_groups * has_system + prompt[:, None] * questions + np.arange(questions)
    if has_system:
        ids = np.concatenate([(prompt // cfg.num_prompts_per_group)[:, None], question_ids], axis=1)
    else:
        ids = question_ids
    offsets = np.arange(num_requests + 1, dtype=np.int64) * cfg.hash_blocks
    list_type = pa.ListArray if offsets[-1] <= LIST_OFFSET_MAX else pa.LargeListArray
    hash_ids = list_type.from_arrays(offsets, pa.array(ids.reshape(-1), type=pa.int64()))
    return RequestTable(
        default_ids(num_requests),
        np.full(num_requests, cfg.input_tokens, dtype=np.int64),
        np.full(num_requests, cfg.output_len, dtype=np.int64),
        hash_ids=hash_ids,
    )

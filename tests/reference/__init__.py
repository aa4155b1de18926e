"""Slow, pure-Python reference implementation of SPEC.md (aggregated and P/D modes) and of
the scheduling policies of docs/policies.md (vllm, sglang, trtllm).

Written independently of ``simcore`` straight from ``SPEC.md`` so that the fast
engine can be compared with it request by request, to the nanosecond.
``sim.simulate`` runs the engine; ``metrics.summarize`` computes the SPEC §10 summary.
"""

"""Schedulers: per-rank batch building for each policy, and the KV cache."""

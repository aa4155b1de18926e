"""Timing models: the duration of one rank's batch (SPEC §8)."""

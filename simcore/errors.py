"""The simulator's input errors, below every stage so that each may raise them.

``simcore.config`` re-exports both; a ConfigError exits with code 2 (SPEC §11).
"""


class ConfigError(ValueError):
    """A configuration value or an input file is invalid (exit code 2)."""


class InstantOverflow(ConfigError):
    """A duration or instant whose ns count an int64 cannot hold (simcore.units)."""

"""Command-line layer of replaysim: Hydra config, result files and the summary table.

The core (:mod:`simcore`) never imports Hydra; this package wraps it.
"""

"""replaysim core: exact, vectorised replay of LLM serving engines.

The core never imports Hydra; ``runners`` wraps it for the command line.
"""

from simcore.api import Result, __version__, run, run_batch
from simcore.config import DEFAULTS, ConfigError, SimConfig, load_config

__all__ = ["DEFAULTS", "ConfigError", "Result", "SimConfig", "__version__", "load_config", "run", "run_batch"]

"""replaysim core: exact, vectorised replay of LLM serving engines.

The core never imports Hydra; ``runners`` wraps it for the command line.
"""

from simcore import jit_cache, numba_startup

jit_cache.configure()  # before any kernel module is imported
numba_startup.install()  # before numba loads its first kernel

from simcore.api import Result, __version__, run, run_batch  # noqa: E402
from simcore.config import DEFAULTS, ConfigError, SimConfig, load_config  # noqa: E402

__all__ = ["DEFAULTS", "ConfigError", "Result", "SimConfig", "__version__", "load_config", "run", "run_batch"]

"""MLflow params pass arctic-rl's secret filter in every process of native verl (arctic_rl.tracking.filter_secret_params).

Loaded by verl itself in every process that imports it, as the other stand-ins (VERL_USE_EXTERNAL_MODULES, set by
recipes/verl/native/run.py). verl's logger (verl/utils/tracking.py:119) logs its whole config as params, and the
launcher's config carries the workers' environment (`ray_kwargs.ray_init.runtime_env.env_vars`), MLFLOW_TRACKING_URI
among it, whose URL may hold a password: without the filter it would be a param of the run.
"""

from arctic_rl.tracking import filter_secret_params

filter_secret_params()

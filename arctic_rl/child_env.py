"""The environment variables a child process gets when it runs what a model wrote (SQL, tool code).

    subprocess.Popen(cmd, env=scrubbed_env())

The loop's process holds secrets in its environment: Ray's cluster token (`RAY_AUTH_TOKEN`, or the file named by
`RAY_AUTH_TOKEN_PATH`), arctic-rl's bearer token (`ARCTIC_RL_TOKEN`), MLflow's tracking URI and credentials,
cloud keys. A child that runs model-written code (the text2sql recipe's SQL workers, SkyRL-gym's Python tool)
needs none of them, and what it can read it can echo into an observation, a log line or the training data. So
such children start with `scrubbed_env()`: the parent's environment without any variable whose name looks like a
secret (`is_secret_name`) and without any value that carries a URL's user:password.

This keeps secrets out of the child's own environment; it is not a sandbox. A child running as the same user can
still read `/proc/<parent pid>/environ` and the user's files (docs/security.md, "Environments and rewards").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# A name containing one of these (any case) is dropped: HF_TOKEN, WANDB_API_KEY, DB_PASSWORD, SSH_AUTH_SOCK, ...
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
# A name starting with one of these is dropped whatever follows: Ray's and arctic-rl's own settings (the cluster's
# address, token and token file; the bearer token), MLflow's tracking URI and its credentials, cloud accounts.
SECRET_NAME_PREFIXES = ("RAY_", "ARCTIC_RL_", "MLFLOW_", "AWS_", "AZURE_", "GOOGLE_", "GCP_", "KRB5")
# A value holding a URL with credentials (scheme://user:password@host) is dropped whatever its name.
_URL_WITH_PASSWORD = re.compile(r"://[^/\s@:]*:[^/\s@]*@")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name is kept from children that run model-written code."""
    upper = name.upper()
    return upper.startswith(SECRET_NAME_PREFIXES) or any(part in upper for part in SECRET_NAME_PARTS)


def scrubbed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without the secret-looking variables, for a child's `env=`."""
    environ = os.environ if environ is None else environ
    return {
        name: value
        for name, value in environ.items()
        if not is_secret_name(name) and not _URL_WITH_PASSWORD.search(value)
    }

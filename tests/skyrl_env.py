"""Where SkyRL's own environment is, and what a test does when it is missing.

`.venv-skyrl` (Python 3.12, SkyRL 0.3.1) is built by `make setup-skyrl`; `make test` builds it and sets
ARCTIC_RL_REQUIRE_SKYRL=1, so there a missing environment is a failure. Elsewhere (`make test-fast`, a fresh
clone, a plain `pytest`) the SkyRL tests skip, naming the command that builds it. ARCTIC_RL_SKYRL_PYTHON
points the tests at another interpreter (the checks of this rule use it to hide the real one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from repo_paths import REPO

REQUIRE_VAR = "ARCTIC_RL_REQUIRE_SKYRL"
PYTHON_VAR = "ARCTIC_RL_SKYRL_PYTHON"


def skyrl_python() -> Path:
    """SkyRL's interpreter; skips (or, with ARCTIC_RL_REQUIRE_SKYRL set, fails) the calling test when absent."""
    python = Path(os.environ.get(PYTHON_VAR) or REPO / ".venv-skyrl" / "bin" / "python")
    if python.exists():
        return python
    reason = f"{python} missing: SkyRL's environment is built by `make setup-skyrl` (`make test` builds it)"
    if os.environ.get(REQUIRE_VAR):
        pytest.fail(f"{reason}; {REQUIRE_VAR} is set, so this is a failure")
    pytest.skip(f"{reason}; set {REQUIRE_VAR}=1 to make this a failure")

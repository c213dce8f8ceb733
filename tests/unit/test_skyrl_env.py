"""The SkyRL tests' rule for a missing .venv-skyrl (tests/skyrl_env.py): skip naming `make setup-skyrl`, unless
ARCTIC_RL_REQUIRE_SKYRL is set (`make test` sets it), then fail."""

from __future__ import annotations

import pytest
from skyrl_env import PYTHON_VAR, REQUIRE_VAR, skyrl_python


def test_missing_skyrl_env_skips_naming_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv(PYTHON_VAR, str(tmp_path / "hidden" / "python"))
    monkeypatch.delenv(REQUIRE_VAR, raising=False)
    with pytest.raises(pytest.skip.Exception, match="make setup-skyrl"):
        skyrl_python()


def test_missing_skyrl_env_fails_when_required(tmp_path, monkeypatch):
    monkeypatch.setenv(PYTHON_VAR, str(tmp_path / "hidden" / "python"))
    monkeypatch.setenv(REQUIRE_VAR, "1")
    with pytest.raises(pytest.fail.Exception, match="make setup-skyrl"):
        skyrl_python()


def test_present_skyrl_env_is_returned(tmp_path, monkeypatch):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv(PYTHON_VAR, str(python))
    monkeypatch.setenv(REQUIRE_VAR, "1")
    assert skyrl_python() == python


def test_skyrl_environments_pin_the_main_environments_mlflow():
    """SkyRL's runs and arctic-rl's share one MLflow store for `arctic-rl compare`; a newer MLflow in a SkyRL
    environment upgrades the store's schema and .venv's MLflow then refuses it ("out-of-date database schema")."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (main,) = re.findall(r'"mlflow==([\d.]+)"', (root / "pyproject.toml").read_text())
    for setup in ("scripts/setup_skyrl_env.sh", "recipes/skyrl/native_cpu/requirements.txt"):
        pins = re.findall(r"mlflow-skinny==([\d.]+)", (root / setup).read_text())
        assert pins == [main], f"{setup}: mlflow-skinny pins {pins}, pyproject.toml has mlflow=={main}"

"""Where the tests and the repository are, for test modules at any depth under tests/ (conftest puts this folder
on sys.path)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# verl 0.9.1's own code, installed --no-deps by scripts/setup_env.sh (verl pins transformers <5.11, so not into
# .venv itself): the reference that the loss, correction and advantage tests compare with.
VERL_REF = REPO / ".venv" / "verl-ref"


def verl_module(name: str):
    """verl's module `name` from VERL_REF; its absence is a failure (setup_env.sh installs it), not a skip."""
    import importlib
    import sys

    assert VERL_REF.is_dir(), f"{VERL_REF} is missing: run scripts/setup_env.sh"
    if str(VERL_REF) not in sys.path:
        sys.path.insert(0, str(VERL_REF))
    return importlib.import_module(name)

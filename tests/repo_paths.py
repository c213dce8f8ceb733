"""Where the tests and the repository are, for test modules at any depth under tests/ (conftest puts this folder
on sys.path)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

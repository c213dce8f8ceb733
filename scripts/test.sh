#!/usr/bin/env bash
# `make test`, the README's test command and CI's only step: environments, the two-host Slurm, style and type
# checks, then the whole suite. Runs from a fresh clone (root + apt needed for Slurm and SkyRL's Python).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs
# SkyRL's environment (its own Python 3.12 and Ray) mostly compiles CPython, while setup_env.sh mostly downloads:
# side by side they take about as long as the longer one. Its log is printed if it fails.
bash scripts/setup_skyrl_env.sh >runs/setup-skyrl.log 2>&1 &
skyrl=$!
bash scripts/setup_env.sh
# The two-host Slurm of the jobs tests; where this kernel refuses namespaces (exit 3, reason in
# /run/arctic-slurm-cluster.refused) the one-node Slurm, and the multi-node tests skip naming the reason.
bash scripts/slurm_cluster.sh up --nodes 2 || { rc=$?; [ "$rc" -eq 3 ] || exit "$rc"; bash scripts/slurm_setup.sh; }
echo "[test] ruff format --check, ruff check, mypy ..."
.venv/bin/ruff format --check --quiet . && .venv/bin/ruff check --quiet . && .venv/bin/mypy
if wait "$skyrl"; then
  tail -n 1 runs/setup-skyrl.log
else
  # Not fatal here: the SkyRL tests then fail on their own (ARCTIC_RL_REQUIRE_SKYRL), after everything else ran.
  echo "[setup-skyrl] FAILED; its last lines (runs/setup-skyrl.log):"
  tail -n 20 runs/setup-skyrl.log
fi
ARCTIC_RL_REQUIRE_SKYRL=1 .venv/bin/python -m pytest -q --durations=15 "$@"

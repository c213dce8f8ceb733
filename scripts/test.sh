#!/usr/bin/env bash
# `make test`, the README's test command and CI's only step: environments, the two-host Slurm, style and type
# checks, then the whole suite. Runs from a fresh clone (root + apt needed for Slurm and SkyRL's Python).
#
# CI's machine keeps state between runs, so a green run could rest on something an earlier run left behind. Every
# run therefore starts from what a new user's machine has:
# - the test Slurm from nothing: `scripts/slurm_cluster.sh purge` stops the daemons these scripts started and
#   removes their configs, accounting database, spool and state (and nothing they did not create), then `up`;
# - the caches the code fills as it runs (converted demo model, text2sql mini set, compiled kernels, DeepSpeed's
#   JIT ops, vLLM's and Hugging Face's caches, deployment records, Ray's session files) in a new, empty HOME and
#   Ray temp dir for this run alone, removed at the end.
# Kept, because they are toolchains keyed by their inputs and rebuilt when those change: .venv and .venv-skyrl
# (stamped by the hash of pyproject.toml and the setup script) and the Python 3.12 that .venv-skyrl is built on
# (a checked source build). scripts/fresh_check.sh rehearses those from nothing too.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs
# SkyRL's environment (its own Python 3.12 and Ray) mostly compiles CPython, while setup_env.sh mostly downloads:
# side by side they take about as long as the longer one. Its log is printed if it fails.
bash scripts/setup_skyrl_env.sh >runs/setup-skyrl.log 2>&1 &
skyrl=$!
bash scripts/setup_env.sh
# The two-host Slurm of the jobs tests, from nothing; where this kernel refuses namespaces (exit 3, reason in
# /run/arctic-slurm-cluster.refused) the one-node Slurm, and the multi-node tests skip naming the reason.
bash scripts/slurm_cluster.sh purge
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
# A short path: Ray's unix sockets live under RAY_TMPDIR and a socket path may not pass 107 bytes.
fresh=$(mktemp -d /tmp/arctic-rl-test.XXXXXX)
trap 'rm -rf "$fresh"' EXIT
mkdir -p "$fresh/home"
echo "[test] fresh HOME=$fresh/home and RAY_TMPDIR=$fresh for this run"
# vLLM's ZeroMQ sockets too (files named by a uuid, left in /tmp by every engine otherwise).
HOME=$fresh/home RAY_TMPDIR=$fresh VLLM_RPC_BASE_PATH=$fresh ARCTIC_RL_REQUIRE_SKYRL=1 \
  .venv/bin/python -m pytest -q --durations=15 "$@"

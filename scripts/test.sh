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
# Ray temp folders of earlier runs' Slurm jobs (<job>-<attempt>-<rank>, jobs/bootstrap.py): a job attempt that a
# test killed (node loss, preemption) cannot remove its own, and the purged Slurm numbers its jobs from 1 again,
# so the next run's jobs would meet them under the same names. Those no running process names are removed.
for d in "/tmp/arctic-rl-ray-$(id -u)"/[0-9]*-[0-9]*-[0-9]*; do
  [ -d "$d" ] && ! pgrep -f -- "$d" >/dev/null && rm -rf -- "$d"
done
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
mkdir -p "$fresh/home" "$fresh/tmp"
echo "[test] fresh HOME=$fresh/home, TMPDIR=$fresh/tmp and RAY_TMPDIR=$fresh for this run"
# TMPDIR and vLLM's ZeroMQ sockets too: what a killed engine or job leaves (vllm_dist_* files, uuid-named sockets,
# SQL scratch folders, torch's compile cache) goes with the run instead of piling up in /tmp.
export HOME=$fresh/home TMPDIR=$fresh/tmp RAY_TMPDIR=$fresh VLLM_RPC_BASE_PATH=$fresh ARCTIC_RL_REQUIRE_SKYRL=1
# OpenMP threads that wait for work sleep instead of spinning (GNU's and Intel's runtimes both read it). Two
# processes computing side by side on two cores otherwise steal each other's cores in spin-waits: measured here,
# a small torch training loop took 2.4 s alone, 18.2 s beside another such loop, 4.0 s beside it with this set.
export OMP_WAIT_POLICY=PASSIVE
# One compute thread per process and per engine (engines take it as their cpu.threads, arctic_rl/config.py
# CpuConfig): the two pytest processes below already fill both cores, and two threads each would make four on two
# cores (the same loop beside a copy of itself: 1.6 s with one thread each, 4.0 s with two each and PASSIVE).
export OMP_NUM_THREADS=1
if [ "$#" -gt 0 ]; then  # a chosen subset: one pytest (not exec: the EXIT trap removes the run's folder)
  rc=0
  .venv/bin/python -m pytest -q --durations=15 "$@" || rc=$?
  exit "$rc"
fi
# The whole suite as two pytest processes side by side: run one after the other, the suite keeps one of the two
# cores idle about half the time (engines starting, Slurm declaring a node dead, a requeued job held, one engine
# computing while the others wait). (1) runs the Slurm jobs tests; its first two jobs run verl's and SkyRL's
# trainers on two nodes, the suite's largest deployments, while (2) runs the unit tests (small processes): one of
# those jobs beside the other end-to-end tests ran this 24 GiB machine out of memory (Ray's memory monitor killed a
# task). (1) then takes the evals', sleep and start-error tests, so both end at about the same time (the first full
# run, without the last two in (1): (1) 3474 s, (2) 3946 s). Each process has its own Ray head
# (ARCTIC_RL_TEST_RAY_PORT) and pytest temp folder; the caches they share are written by rename or under a file
# lock, and the Slurm jobs run in the cluster's network namespaces, so no port collides.
first=(tests/e2e/test_jobs_multinode.py tests/e2e/test_jobs_slurm.py tests/e2e/test_jobs_bootstrap.py
  tests/e2e/test_evals_model_mode.py tests/e2e/test_sleep.py tests/e2e/test_engine_start_errors.py)
second=(tests/unit tests/e2e tests/gpu)
ignore=()
for path in "${first[@]}"; do ignore+=(--ignore="$path"); done
log=runs/test-1.log
echo "[test] two pytest processes: (1) ${first[*]} -> $log (printed when done); (2) the rest, here"
ARCTIC_RL_TEST_RAY_PORT=6491 .venv/bin/python -m pytest -q --durations=15 -p no:cacheprovider \
  --basetemp="$fresh/pytest-1" "${first[@]}" >"$log" 2>&1 &
one=$!
rc2=0
.venv/bin/python -m pytest -q --durations=15 --basetemp="$fresh/pytest-2" "${second[@]}" "${ignore[@]}" \
  | tee runs/test-2.log || rc2=${PIPESTATUS[0]}
echo "[test] (2) done (exit $rc2); waiting for (1) ${first[*]} ..."
rc1=0
wait "$one" || rc1=$?
echo "========== (1) ${first[*]} (exit $rc1) =========="
cat "$log"
# One closing line for both processes (each printed its own above).
count() {  # $1 of both closing lines ("926 passed, 31 skipped, ... in 3125.92s")
  local f n s=0
  for f in runs/test-1.log runs/test-2.log; do
    n=$(grep -E " in [0-9.]+s" "$f" | tail -n 1 | grep -oE "[0-9]+ $1" | cut -d' ' -f1)
    s=$((s + ${n:-0}))
  done
  echo "$s"
}
echo "total: $(count passed) passed, $(count failed) failed, $(count skipped) skipped"
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ]

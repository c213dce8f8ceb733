#!/usr/bin/env bash
# SkyRL's own environment (.venv-skyrl), beside the main .venv: skyrl-train 0.3.x requires Python
# 3.12 and pins ray 2.51.1, this machine's Debian has Python 3.11 and the main environment runs Ray
# 2.60. So SkyRL runs in its own interpreter and drives arctic-rl over HTTP (recipes/skyrl); the
# server it talks to runs in .venv (ArcticRLClientConfig.server_python).
#
# Python 3.12 comes from a package registry: Ubuntu 24.04's python3.12 source package (its binary
# packages need glibc 2.38, Debian 12 has 2.36), checked against the archive's sha256 and built
# once into ~/.cache/arctic-rl/python3.12 (~4 min on 2 cores, no PGO). Idempotent like setup_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-skyrl
PREFIX=${ARCTIC_RL_PY312_PREFIX:-$HOME/.cache/arctic-rl/python3.12}
STAMP=$VENV/.arctic-rl-installed
want=$(cat scripts/setup_skyrl_env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[setup-skyrl] $VENV is up to date"; exit 0
fi

# A private temp folder for this run, removed at exit: the CPython build, and uv's build environments' lock files
# (uv-setuptools-*.lock, left in the temp folder otherwise).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch

if [ ! -x "$PREFIX/bin/python3.12" ]; then
  SRC=http://archive.ubuntu.com/ubuntu/pool/main/p/python3.12/python3.12_3.12.3.orig.tar.xz
  SHA=56bfef1fdfc1221ce6720e43a661e3eb41785dd914ce99698d8c7896af4bdaa1
  if ! dpkg -s libssl-dev libffi-dev zlib1g-dev libbz2-dev liblzma-dev libsqlite3-dev >/dev/null 2>&1; then
    echo "[setup-skyrl] installing CPython build dependencies (apt) ..."
    # One apt at a time with scripts/slurm_lib.sh (`make test` runs both side by side).
    DEBIAN_FRONTEND=noninteractive flock /run/arctic-rl-apt.lock apt-get install -y -q build-essential libssl-dev libffi-dev zlib1g-dev \
      libbz2-dev liblzma-dev libsqlite3-dev >/dev/null
  fi
  work=$scratch/build
  mkdir -p "$work"
  echo "[setup-skyrl] downloading CPython 3.12.3 source (Ubuntu noble's python3.12 package) ..."
  curl -fsSL --retry 3 -o "$work/py.tar.xz" "$SRC"
  echo "$SHA  $work/py.tar.xz" | sha256sum -c --quiet
  tar -xJf "$work/py.tar.xz" -C "$work"
  echo "[setup-skyrl] building CPython 3.12.3 into $PREFIX (a few minutes) ..."
  (cd "$work"/Python-3.12.3 && ./configure -q --prefix="$work/install" --with-ensurepip=install >/dev/null \
     && make -s -j"$(nproc)" >/dev/null 2>"$work/make.err" && make -s altinstall >/dev/null 2>>"$work/make.err") \
    || { tail -30 "$work/make.err" >&2; exit 1; }
  # Moved into place only when complete: an interrupted build leaves nothing half-written behind.
  mkdir -p "$(dirname "$PREFIX")" && rm -rf "$PREFIX" && mv "$work/install" "$PREFIX"
  # The build's absolute paths point into $work; CPython relocates from sys.executable, so this works.
fi
"$PREFIX/bin/python3.12" -c "import ssl, sqlite3, lzma, bz2, ctypes, venv" \
  || { echo "[setup-skyrl] $PREFIX/bin/python3.12 lacks a stdlib module; rm -rf $PREFIX and rerun" >&2; exit 1; }

[ -x $VENV/bin/python ] || "$PREFIX/bin/python3.12" -m venv $VENV
# uv, from its cache, as in setup_env.sh: the 3 GB CUDA torch below was fetched again by pip on every run.
$VENV/bin/python -m pip install -q --disable-pip-version-check "uv==0.13.8"
[ -n "${PIP_FIND_LINKS:-}" ] && export UV_FIND_LINKS=$PIP_FIND_LINKS
[ -f /etc/xdg/pip/constraints.txt ] && export UV_CONSTRAINT=/etc/xdg/pip/constraints.txt
PIP="$VENV/bin/uv pip install --python $VENV/bin/python --quiet"
echo "[setup-skyrl] installing torch and SkyRL's runtime dependencies ..."
# PyPI has only the CUDA build for cp312 (the CPU wheels in /opt/wheels are cp311; download.pytorch.org is not
# reachable): ~3 GB with its nvidia-* libraries, which torch needs to import even on a machine without a GPU.
$PIP "torch==2.13.0"
# skyrl-train's own requirements minus the GPU stack (flash-attn, vllm, deepspeed) and the cloud/UI
# extras it never imports on this path (wandb, s3fs, tensorboard, debugpy, hf_transfer): --no-deps for
# skyrl-train itself, its imports listed here. transformers as in .venv (5.19; skyrl-train asks >=4.51), so a
# model or tokenizer saved by either environment loads in both. The arctic-rl client needs httpx, pydantic,
# safetensors. MLflow as in .venv (pyproject.toml): a store one MLflow version upgraded is refused by an older one
# ("out-of-date database schema"), and `arctic-rl compare` reads SkyRL's runs beside arctic-rl's in one store.
$PIP "ray==2.51.1" "transformers==5.19.0" "hydra-core==1.3.2" omegaconf loguru tqdm jaxtyping \
  "tensordict" "datasets==4.0.0" torchdata peft accelerate func_timeout polars fastapi uvicorn pybind11 \
  "mlflow-skinny==3.17.2" sqlalchemy alembic httpx "pydantic>=2" safetensors pyyaml sqlglot pytest
$PIP --no-deps "skyrl-train==0.3.1" "skyrl-gym==0.3.0"
echo "$want" > "$STAMP"
echo "[setup-skyrl] done: $($VENV/bin/python -c 'import sys, torch, ray, skyrl_train, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "ray", ray.__version__, "transformers", transformers.__version__)')"

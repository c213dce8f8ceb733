# The two commands a newcomer needs (both create or refresh .venv by themselves):
#   make demo   the main job on the embedded default (GRPO text-to-SQL on the bundled model and data)
#   make test   the full test suite (starts a two-host Slurm for the jobs tests; needs root + apt)
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-skyrl demo test test-fast lint slurm bench

setup:
	bash scripts/setup_env.sh

# SkyRL's own environment (.venv-skyrl: Python 3.12 built from Ubuntu's source package, Ray 2.51); the
# SkyRL integration tests run in it.
setup-skyrl:
	bash scripts/setup_skyrl_env.sh

demo: setup
	$(PY) -m arctic_rl.cli run recipes/text2sql/configs/cpu_demo.yaml model.name_or_path=demo

# The two-host Slurm of the jobs tests (one network namespace per node); where this kernel refuses
# namespaces (exit 3, reason in /run/arctic-slurm-cluster.refused) the one-node Slurm, and the
# multi-node tests skip naming the reason.
slurm:
	bash scripts/slurm_cluster.sh up --nodes 2 || { test $$? -eq 3 && bash scripts/slurm_setup.sh; }

# Environments (SkyRL's built alongside), the two-host Slurm from nothing (purged first), ruff + mypy, then the
# whole suite in a fresh HOME: scripts/test.sh. scripts/fresh_check.sh rehearses a new user (clean clone, make demo + test).
test:
	bash scripts/test.sh

lint: setup
	.venv/bin/ruff format --check . && .venv/bin/ruff check . && .venv/bin/mypy

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) benchmarks/backend.py
	$(PY) benchmarks/zorro_train.py
	$(PY) benchmarks/cascade_attention.py
	$(PY) benchmarks/weight_sync.py
	$(PY) benchmarks/vs_verl.py
	$(PY) benchmarks/vs_trl.py

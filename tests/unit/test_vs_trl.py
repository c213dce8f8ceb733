"""benchmarks/vs_trl.py runs the same workload on both sides: TRL's GRPOConfig and the arctic-rl run config are
made from one Workload and read back to it; a TRL setting changed on one side only is named; TRL's data holds
the loop's prompts step by step. No run: the runs belong in benchmarks/ (docs/benchmarks/vs_trl-*.md)."""

from __future__ import annotations

import sys

import pytest
from repo_paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import vs_trl  # noqa: E402


@pytest.fixture(scope="module")
def trl_importable():
    """TRL on sys.path for this module only (it lives off the main path: verl 0.9.1 breaks when trl 1.x is
    importable, and later tests in this session may import verl)."""
    path = list(sys.path)
    vs_trl.use_trl()
    yield
    sys.path[:] = path
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        del sys.modules[name]


@pytest.fixture(scope="module", params=[False, True], ids=["full", "quick"])
def sides(request, tmp_path_factory, trl_importable):
    cfg = vs_trl.run_config(quick=request.param)
    w = vs_trl.arctic_workload(cfg)
    args = vs_trl.trl_config(w, tmp_path_factory.mktemp("trl"))
    return cfg, w, args


def _read_back(w, args):
    return vs_trl.trl_workload(args, w.model, w.dtype, w.max_prompt_length, w.stop, w.recipe_options, w.sampler_dtype)


def test_both_sides_read_back_the_same_workload(sides):
    cfg, w, args = sides
    assert vs_trl.differences(w, _read_back(w, args)) == []
    # the workload is the demo's: the run config's own numbers, not the script's
    assert (w.prompts_per_step, w.n, w.max_completion_length, w.lr) == (
        cfg.train.prompts_per_step,
        cfg.sampling.n,
        cfg.sampling.max_tokens,
        cfg.client_config().training_config.optimizer.lr,
    )
    assert w.optimizer_steps_per_step * args.per_device_train_batch_size * args.gradient_accumulation_steps == (
        w.prompts_per_step * w.n
    )


def test_trl_generates_with_vllm_in_arctic_rls_sampler_dtype_and_keeps_fp32_master_weights(sides):
    cfg, w, args = sides
    from arctic_rl.config import sampler_dtype

    assert args.use_vllm and args.vllm_mode == "colocate" and not args.use_transformers_continuous_batching
    assert not args.vllm_importance_sampling_correction  # the demo config sets no rollout_is
    assert (w.generation, w.master_weights) == ("vllm", "float32")
    assert w.sampler_dtype == sampler_dtype(cfg.client_config())
    assert args.vllm_max_model_length == cfg.client_config().vllm_config.max_seq_len


@pytest.mark.parametrize("mode", ["continuous-batching", "generate"])
def test_trls_earlier_generation_modes_are_named_as_different(sides, tmp_path, mode):
    """TRL's continuous batching casts its model to bf16 and trains it so (no fp32 master copy): the settings
    check sees it in master_weights, and only the generation fields may differ in those modes."""
    _, w, _ = sides
    args = vs_trl.trl_config(w, tmp_path, mode)
    assert not args.use_vllm and args.use_transformers_continuous_batching == (mode == "continuous-batching")
    tw = _read_back(w, args)
    named = {d.split(":")[0] for d in vs_trl.differences(w, tw)}
    assert "generation" in named and named <= set(vs_trl.GENERATION_FIELDS)
    assert ("master_weights" in named) == (mode == "continuous-batching")
    with pytest.raises(SystemExit, match="generation"):
        vs_trl.check_same(w, tw)
    assert vs_trl.check_same(w, tw, allowed=vs_trl.GENERATION_FIELDS)  # allowed, and returned to be reported


def test_trls_vllm_shims_give_its_llm_the_sampler_dtype_and_arctic_rls_reload(trl_importable):
    import functools

    from trl.generation import vllm_generation

    llm, sync = vllm_generation.LLM, vllm_generation.VLLMGeneration.sync_weights
    try:
        vs_trl.install_trl_vllm_shims("bfloat16")
        vs_trl.install_trl_vllm_shims("bfloat16")  # idempotent: one partial
        assert isinstance(vllm_generation.LLM, functools.partial) and vllm_generation.LLM.func is llm
        assert vllm_generation.LLM.keywords == {"dtype": "bfloat16"}
        assert vllm_generation.VLLMGeneration.sync_weights is vs_trl.trl_vllm_sync
    finally:
        vllm_generation.LLM, vllm_generation.VLLMGeneration.sync_weights = llm, sync


def test_full_workload_is_the_cpu_demo_without_warm_up(sides):
    cfg, w, args = sides
    if w.steps == 2:
        pytest.skip("quick sizes")
    assert (w.steps, w.prompts_per_step, w.n, w.max_completion_length, w.optimizer_steps_per_step) == (10, 4, 8, 48, 2)
    assert (args.max_steps, args.gradient_accumulation_steps, args.steps_per_generation) == (20, 2, 4)
    assert cfg.sft_warmup.epochs == 0 and cfg.eval.split is None


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("learning_rate", 2e-5, "lr"),
        ("num_generations", lambda a: a.num_generations // 2, "n"),
        ("max_completion_length", 64, "max_completion_length"),
        ("max_steps", 10, "steps"),
        ("gradient_accumulation_steps", lambda a: a.gradient_accumulation_steps * 2, "optimizer_steps_per_step"),
        ("epsilon_high", 0.2, "clip_high"),
        ("loss_type", "grpo", "loss_agg"),
        ("lr_scheduler_type", "linear", "lr_schedule"),
        ("vllm_importance_sampling_correction", True, "rollout_correction"),
        ("use_vllm", False, "generation"),
    ],
)
def test_a_setting_changed_on_the_trl_side_is_named(sides, field, value, named):
    from trl import GRPOConfig

    _, w, args = sides
    kwargs = vs_trl.trl_config_kwargs(w, args.output_dir)
    changed = _read_back(w, GRPOConfig(**{**kwargs, field: value(args) if callable(value) else value}))
    assert named in [d.split(":")[0] for d in vs_trl.differences(w, changed)]
    with pytest.raises(SystemExit, match=named):
        vs_trl.check_same(w, changed)


def test_trl_data_is_the_loops_prompts_in_the_loops_order(sides):
    from transformers import AutoTokenizer

    from arctic_rl.loop.data import prompt_ids, step_indices

    cfg, w, _ = sides
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    examples = vs_trl.train_examples(cfg, tok)
    rows = vs_trl.trl_rows(w, examples, tok)
    order = [i for s in range(1, w.steps + 1) for i in step_indices(s, len(examples), w.prompts_per_step, w.seed)]
    assert [r["idx"] for r in rows] == order
    # TRL tokenizes a plain-text prompt as the loop does (no special token added): same prompt ids
    for r in rows[:3]:
        assert tok(r["prompt"])["input_ids"] == prompt_ids(tok, examples[r["idx"]])
    stops = vs_trl.stop_token_ids(tok, w.stop)
    assert stops and all("```" in tok.decode([i]) for i in stops)


def test_a_sides_leftover_processes_are_found_by_its_session_and_no_others():
    """spawn_side runs a side in a session of its own and then kills what is left of that session (the arctic-rl
    side's Ray cluster): a process the side left behind is found, a process of another session is not (a first
    version matched Ray's temp folder by name and killed a concurrent `make demo`'s cluster)."""
    import subprocess
    import time

    side = subprocess.Popen(["sh", "-c", "sleep 60 & exit 0"], start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        side.wait()
        time.sleep(0.2)
        left = vs_trl._session_pids(side.pid)
        assert len(left) == 1 and other.pid not in left
        assert vs_trl._session_pids(other.pid) == [other.pid]
    finally:
        for pid in vs_trl._session_pids(side.pid) + [other.pid]:
            subprocess.run(["kill", "-9", str(pid)])
        other.wait()

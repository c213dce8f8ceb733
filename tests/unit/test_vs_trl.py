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
    return vs_trl.trl_workload(args, w.model, w.dtype, w.max_prompt_length, w.stop, w.recipe_options)


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


def test_trls_continuous_batching_mode_runs_the_same_workload(sides, tmp_path):
    _, w, _ = sides
    args = vs_trl.trl_config(w, tmp_path, "continuous-batching")
    assert (
        args.use_transformers_continuous_batching
        and not vs_trl.trl_config(w, tmp_path).use_transformers_continuous_batching
    )
    assert vs_trl.differences(w, _read_back(w, args)) == []


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

"""`arctic-rl plan`: the controller's placement laid over nodes, memory per GPU, CPUs per node, and a refusal
with a reason when a run cannot fit. Pure computation: no Ray, no GPUs, no downloads (the 4x8 configs' model
is sized from the config.json their recipes ship)."""

from __future__ import annotations

import pytest
from repo_paths import REPO

from arctic_rl.cli import main as cli
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import ConfigError
from arctic_rl.plan import GiB, make_plan, plan_run
from arctic_rl.runconfig import load_run_config
from arctic_rl.server import placement

ROOT = REPO
BIRD = ROOT / "recipes/text2sql/configs/bird_qwen3_32b.yaml"
LONGQA = ROOT / "recipes/longqa/configs/longqa_qwen3_32b.yaml"


def test_layout_is_the_controllers():
    """Colocated TP 2: trainer i and TP worker i share bundle i; the reference sits on bundle 0 (ZeRO-1/2)."""
    cfg = ArcticRLClientConfig(
        model_name="unused", training_gpus=4, sampling_gpus=4, vllm_config={"tensor_parallel_size": 2}
    )
    lay = placement.gpu_layout(cfg)
    assert lay.pools == {"shared": 4}
    assert [s.bundle for s in lay.trainers] == [0, 1, 2, 3] and [s.bundle for s in lay.references] == [0]
    assert [s.devices for s in lay.samplers] == [(0, 1), (2, 3)] and lay.samplers[0].gpu_share == 0
    assert dict(lay.samplers[1].env)["VLLM_RAY_BUNDLE_INDICES"] == "2,3"
    # ZeRO-3: the reference is partitioned like the trainer, rank r beside trainer rank r; none without KL
    z3 = cfg.model_copy(update={"training_config": cfg.training_config.model_copy(update={"zero_stage": 3})})
    assert [s.bundle for s in placement.gpu_layout(z3).references] == [0, 1, 2, 3]
    assert placement.gpu_layout(cfg.model_copy(update={"use_reference": False})).references == ()
    split = placement.gpu_layout(cfg.model_copy(update={"colocate": False, "reference_gpus": 2}))
    assert split.pools == {"training": 4, "sampling": 4, "reference": 2} and split.references[1].pool == "reference"


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"sampling_gpus": 4},
        {"training_gpus": 4},
        {"colocate": False},
        {"reference_gpus": 2},
        {"colocate": False, "sampling_gpus": 3, "reference_gpus": 1},
    ],
)
def test_gpu_count_is_the_layouts(update):
    """The `gpus` tag runs are matched by (ArcticRLClientConfig.gpu_count) counts the GPUs the controller lays
    out: the loop counted only the trainer's when colocated, so a run sampling on more GPUs than it trains on
    was tagged with fewer than it held."""
    cfg = ArcticRLClientConfig(model_name="unused", training_gpus=2, sampling_gpus=2).model_copy(update=update)
    assert cfg.gpu_count == sum(placement.gpu_layout(cfg).pools.values())


@pytest.mark.parametrize("path", [BIRD, LONGQA], ids=["text2sql", "longqa"])
def test_4x8_configs_place_and_count(path):
    run = load_run_config(path)
    assert run.checkpoint.every > 0 and run.sleep_engines
    plan = make_plan(run, nodes=4, gpus_per_node=8, cpus_per_node=16, name=path.name)
    assert 32.5e9 < plan.model.params < 33e9  # Qwen3-32B: 32.8B
    assert len(plan.gpus) == 32 and plan.cpus_needed == [8, 8, 8, 8]
    tp = run.backend["vllm_config"]["tensor_parallel_size"]
    for g in plan.gpus:
        kinds = sorted(e.engine for e in g.engines)
        assert kinds.count("training") == 1 and kinds.count("sampling") == 1, g
    # no KL term in these runs: no reference deployed; with one, ZeRO-3 partitions it like the trainer
    assert not any(e.engine == "reference" for g in plan.gpus for e in g.engines)
    kl = make_plan(load_run_config(path, ["loss.config.use_kl_loss=true"]), nodes=4, gpus_per_node=8, name=path.name)
    refs = [e for g in kl.gpus for e in g.engines if e.engine == "reference"]
    assert len(refs) == 32 and refs[0].awake_bytes["params"] == pytest.approx(2 * kl.model.params / 32)
    # every TP group on one node
    assert not any("spans nodes" in p for p in plan.problems)
    text = plan.render()
    assert "node 3" in text and f"x TP {tp}" in text and "CPUs per node" in text


def test_4x8_configs_fit_on_80_gib():
    """The published 32B setups fit on 4 x 8 GPUs of 80 GiB as shipped, because: asleep, the trainer holds
    nothing of its state on the device (SLEEP_KEEPS); no reference without a KL term; at the sync the trainer
    has emptied its activations' cache and the sampler has its weights back but not yet its KV cache
    (RELEASED_IN_PHASE); text2sql's 65K-token micro-batch keeps its layers' inputs on the host
    (offload_activations). Without those the same configs do not fit, and the refusal names the reason."""
    for path in (BIRD, LONGQA):
        plan = plan_run(load_run_config(path), nodes=4, gpus_per_node=8, name=path.name)
        assert plan.fits and "verdict: fits" in plan.render()
        assert max(g.peak for g in plan.gpus) < 80 * GiB
    no_offload = make_plan(
        load_run_config(BIRD, ["backend.training_config.offload_activations=false"]), nodes=4, gpus_per_node=8
    )
    with pytest.raises(ConfigError, match=r"needs .* GiB in phase 'train', mostly trainer 0 activations"):
        no_offload.check()
    with_kl = make_plan(load_run_config(LONGQA, ["loss.config.use_kl_loss=true"]), nodes=4, gpus_per_node=8)
    assert any(e.engine == "reference" for e in with_kl.gpus[0].engines)


def test_zero3_partitions_trainer_state():
    run = load_run_config(BIRD)
    plan = make_plan(run, nodes=4, gpus_per_node=8)
    trainer = next(e for e in plan.gpus[5].engines if e.engine == "training").awake_bytes
    psi = plan.model.params
    assert trainer["params"] == pytest.approx(2 * psi / 32) and trainer["optimizer"] == pytest.approx(12 * psi / 32)
    stage1 = make_plan(load_run_config(BIRD, ["backend.training_config.zero_stage=1"]), nodes=4, gpus_per_node=8)
    t1 = next(e for e in stage1.gpus[5].engines if e.engine == "training").awake_bytes
    assert t1["params"] == pytest.approx(2 * psi) and t1["grads"] == pytest.approx(2 * psi)
    assert t1["optimizer"] == pytest.approx(12 * psi / 32)


@pytest.mark.parametrize(
    "args, reason",
    [
        (["backend.vllm_config.tensor_parallel_size=16", "backend.sampling_gpus=32"], "larger than --gpus-per-node=8"),
        (["backend.colocate=false"], "need 64 GPUs"),
    ],
)
def test_refuses_what_cannot_be_placed(args, reason):
    with pytest.raises(ConfigError, match=reason):
        plan_run(load_run_config(BIRD, args), nodes=4, gpus_per_node=8)


def test_refuses_too_few_cpus():
    with pytest.raises(ConfigError, match="--cpus-per-node=1 but node 0 needs 8 Ray CPUs"):
        plan_run(load_run_config(BIRD), nodes=4, gpus_per_node=8, cpus_per_node=1)


def test_memory_over_a_gpu_is_refused_and_a_big_gpu_fits(tmp_path):
    # a small model sized from a config file: fits on 80 GiB, not on 4 GiB
    cfg = tmp_path / "small.json"
    cfg.write_text(
        '{"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8, '
        '"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32000}'
    )
    run = load_run_config(
        BIRD,
        [
            "backend.training_gpus=8",
            "backend.sampling_gpus=8",
            "backend.vllm_config.max_seq_len=4096",
            "sampling.max_tokens=1024",
        ],
    )
    ok = plan_run(run, nodes=1, gpus_per_node=8, model_config_path=str(cfg))
    assert ok.fits and all(g.peak < 80 * GiB for g in ok.gpus)
    with pytest.raises(ConfigError, match="need more than 4.0 GiB"):
        plan_run(run, nodes=1, gpus_per_node=8, gpu_memory_gib=4, model_config_path=str(cfg))


def test_cli_prints_and_exits_nonzero_when_it_cannot_fit(capsys):
    assert cli(["plan", str(BIRD), "--nodes", "1", "--gpus-per-node", "8"]) == 1
    out, err = capsys.readouterr()
    assert "placement" in out and "need 32 GPUs" in err and "1 node(s) x 8 GPU(s) = 8" in err
    assert cli(["plan", str(BIRD), "--nodes", "0", "--gpus-per-node", "8"]) == 2
    assert "nodes must be a positive integer" in capsys.readouterr().err


def test_hub_model_without_a_config_is_refused():
    run = load_run_config(BIRD, ["model.name_or_path=SomeOrg/NotShipped-7B"])
    with pytest.raises(ConfigError, match="no config to size it from.*--model-config"):
        make_plan(run, nodes=4, gpus_per_node=8)


def test_offloaded_activations_leave_the_device():
    """offload_activations takes the layers' checkpointed inputs (layers x tokens x hidden, bf16) off the GPU
    estimate and says what they take on the host."""
    on = load_run_config(BIRD, ["backend.training_config.offload_activations=true"])
    off = load_run_config(BIRD, ["backend.training_config.offload_activations=false"])
    p_on, p_off = (make_plan(r, nodes=4, gpus_per_node=8) for r in (on, off))
    m = p_on.model
    act = [
        next(e for e in p.gpus[5].engines if e.engine == "training").awake_bytes["activations"] for p in (p_on, p_off)
    ]
    tokens = 32768 + 8 * 4096  # one prompt group, ZoRRo: the prompt once and its 8 responses
    assert act[1] - act[0] == pytest.approx(m.layers * tokens * m.hidden * 2)
    assert any("offload_activations" in n for n in p_on.notes) and not any("offload_act" in n for n in p_off.notes)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_lora_trains_only_the_adapters(tiny_llama, targets):
    """With training_config.lora the trainer's grads and optimizer state are the adapters' (counted as PEFT
    builds them on the real model), and the frozen base weights stay whole in the compute dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from arctic_rl.config import LoraConfig
    from arctic_rl.engines.lora import apply_lora
    from arctic_rl.plan import Device, lora_params, model_shape, trainer_bytes

    lora = LoraConfig(rank=4, target_modules=targets)
    peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_llama), lora)
    adapters = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    m = model_shape(AutoConfig.from_pretrained(tiny_llama), str(tiny_llama))
    assert lora_params(m, lora) == adapters
    tc = {"zero_stage": 2, "lora": lora.model_dump()}
    cfg = ArcticRLClientConfig(model_name=str(tiny_llama), training_gpus=4, training_config=tc)
    t = trainer_bytes(m, cfg, tokens=64, device=Device.gpu())
    assert t["frozen base"] == 2 * m.params and t["params"] == 2 * adapters
    assert t["grads"] == pytest.approx(2 * adapters / 4) and t["optimizer"] == pytest.approx(12 * adapters / 4)
    assert t["zero buffers"] == 2 * 2 * adapters


def test_a_32b_lora_run_fits_where_full_training_does_not():
    """On 8 GPUs of 141 GiB (H200) Qwen3-32B under ZeRO-2 does not fit with full-parameter training (16 B/param,
    of which 2 whole on every GPU), and fits with LoRA (its frozen bf16 base + rank-16 adapters' state)."""
    over = ["backend.training_gpus=8", "backend.sampling_gpus=8", "backend.training_config.zero_stage=2"]
    with pytest.raises(ConfigError, match="mostly trainer 0 (params|grads|optimizer)"):
        plan_run(load_run_config(BIRD, over), nodes=1, gpus_per_node=8, gpu_memory_gib=141)
    lora = load_run_config(BIRD, [*over, "backend.training_config.lora={rank: 16}"])
    plan = plan_run(lora, nodes=1, gpus_per_node=8, gpu_memory_gib=141)
    trainer = next(e for e in plan.gpus[0].engines if e.engine == "training").awake_bytes
    assert trainer["frozen base"] == 2 * plan.model.params and trainer["optimizer"] < 0.5 * GiB


def test_the_gpu_memory_is_an_option_and_the_cpu_device_is_this_machines_ram(tmp_path):
    """The same per-engine model sizes a GPU of the memory given (`--gpu-memory-gib`, default 80) and this
    machine's RAM as the CPU device: there vLLM-CPU's KV cache is cpu_kvcache_space_gb whole GiB, no CUDA
    context is counted, and the trainer's fp32 load is part of its peak."""
    from arctic_rl.plan import CPU_RUNTIME, DEFAULT_GPU_MEMORY_GIB, Device, engine_memory, engine_peak

    assert DEFAULT_GPU_MEMORY_GIB == 80
    assert cli(["plan", str(BIRD), "--nodes", "4", "--gpus-per-node", "8", "--gpu-memory-gib", "40"]) == 1
    assert make_plan(load_run_config(BIRD), nodes=4, gpus_per_node=8, gpu_memory_gib=141).gpu_memory == 141 * GiB
    total = next(int(ln.split()[1]) * 1024 for ln in open("/proc/meminfo") if ln.startswith("MemTotal:"))
    cpu = Device.cpu()
    assert cpu.kind == "cpu" and cpu.memory == total
    m = make_plan(load_run_config(BIRD), nodes=4, gpus_per_node=8).model
    cfg = ArcticRLClientConfig(model_name="unused", vllm_config={"max_seq_len": 256, "cpu_kvcache_space_gb": 2.5})
    parts = engine_memory(m, cfg, 64, cpu)
    assert parts["sampling"] == {"weights": 2 * m.params, "kv cache": 2 * GiB, "runtime": CPU_RUNTIME}
    assert not any("context" in p for p in parts.values())
    assert "context" in engine_memory(m, cfg, 64, Device.gpu(80))["training"]
    frozen = cfg.model_copy(update={"training_config": cfg.training_config.model_copy(update={"zero_stage": 1})})
    assert engine_peak(m, frozen, 64, cpu)["reference"] == 4 * m.params  # the fp32 load, above the 2 B/param kept
    with pytest.raises(ConfigError, match="gpu_memory_gib must be > 0, got 0"):
        Device.gpu(0)


def test_the_skyrl_sql_scale_multiturn_config_fits_one_node_of_8():
    """recipes/text2sql/configs/skyrl_sql_qwen25_coder_7b.yaml (issue 27: multi-turn text-to-SQL at SkyRL-SQL's
    published scale): Qwen2.5-Coder-7B from the architecture its recipe ships, colocated on 1 x 8 GPUs, 2 vLLM
    engines of TP 4, ZoRRo on prefix trees, and fits on 80 GiB GPUs as shipped."""
    path = ROOT / "recipes/text2sql/configs/skyrl_sql_qwen25_coder_7b.yaml"
    run = load_run_config(path)
    assert run.env is not None and run.env.max_turns == 6 and run.sampling.n == 5
    assert run.backend["training_config"]["zorro_train"] == {"enable": True, "prefix_tree": True}
    plan = plan_run(run, nodes=1, gpus_per_node=8, name=path.name)
    assert 7.5e9 < plan.model.params < 7.7e9  # Qwen2.5-Coder-7B: 7.62B
    assert plan.fits and max(g.peak for g in plan.gpus) < 80 * GiB
    assert [sorted(e.engine for e in g.engines) for g in plan.gpus] == [["sampling", "training"]] * 8


MOE_30B = ROOT / "recipes/text2sql/configs/bird_qwen3_30b_a3b.yaml"
MOE_235B = ROOT / "recipes/text2sql/configs/bird_qwen3_235b_a22b.yaml"


def test_an_moe_plan_counts_experts_active_params_and_routing():
    """Qwen3-30B-A3B from the architecture its recipe ships: 30.5B parameters of which 29.0B in 48 layers x 128
    routed experts, 3.35B active per token (8 experts of 128), as Qwen publishes (30.5B / 3.3B). Its trainer counts
    the experts' activations per token for the 8 experts a token goes to (not the dense intermediate size) and
    the routing tensors; the plan prints the expert counts."""
    run = load_run_config(MOE_30B)
    plan = plan_run(run, nodes=1, gpus_per_node=8, name=MOE_30B.name)
    m = plan.model
    assert 30.4e9 < m.params < 30.6e9 and 28.9e9 < m.expert_params < 29.1e9 and 3.3e9 < m.active_params < 3.4e9
    assert (m.experts, m.experts_per_token, m.moe_layers, m.moe_intermediate) == (128, 8, 48, 768)
    trainer = next(e for e in plan.gpus[0].engines if e.engine == "training").awake_bytes
    assert 0 < trainer["routing"] < trainer["activations"]
    assert "48 MoE layers x 128 experts, 8 per token" in plan.render() and "3.35B active per token" in plan.render()
    dense = make_plan(load_run_config(BIRD), nodes=4, gpus_per_node=8)
    assert dense.model.experts == 0 and dense.model.active_params == dense.model.params
    assert "routing" not in dense.gpus[0].engines[0].awake_bytes and "experts:" not in dense.render()


def test_the_30b_a3b_config_fits_one_node_of_8_and_tp_2_would_not():
    """As shipped (vLLM TP 4) it fits on 1 x 8 GPUs of 80 GiB; with TP 2 the sampler's 28 GiB of weights per GPU
    beside the awake trainer at the weight sync are over (the reason its config names)."""
    plan = plan_run(load_run_config(MOE_30B), nodes=1, gpus_per_node=8)
    assert plan.fits and max(g.peak for g in plan.gpus) < 80 * GiB
    with pytest.raises(ConfigError, match="in phase 'sync', mostly trainer 0 optimizer .* sampler 0 \\(TP 1/2\\)"):
        plan_run(load_run_config(MOE_30B, ["backend.vllm_config.tensor_parallel_size=2"]), nodes=1, gpus_per_node=8)


def test_the_235b_a22b_config_fits_8x8_h200s_because_ranks_load_their_partitions():
    """On 8 x 8 H200s it fits: under ZeRO-3 over 64 ranks each rank loads its partitions a decoder layer at a time
    (engines/zero3_load.py). Were every rank to load the whole model in fp32 (876 GiB, 8 per node), the plan
    refuses the start-up host memory of a 2 TiB node, naming it. On 80 GiB GPUs the sync phase is over."""
    run = load_run_config(MOE_235B)
    plan = make_plan(run, nodes=8, gpus_per_node=8, gpu_memory_gib=141)
    assert 235.0e9 < plan.model.params < 235.2e9 and 22.1e9 < plan.model.active_params < 22.3e9
    assert plan.fits and any("each rank builds only its partitions" in n for n in plan.notes)
    # the same model on ZeRO-2 (whole-model loads) over the same nodes: refused for the host memory, named
    whole = make_plan(
        load_run_config(MOE_235B, ["backend.training_config.zero_stage=2"]),
        nodes=8,
        gpus_per_node=8,
        gpu_memory_gib=141,
    )
    start_up = [p for p in whole.problems if p.startswith("host memory at start-up: 8 trainer/reference worker(s)")]
    assert start_up and "875.8 GiB" in start_up[0]
    on_h100 = make_plan(run, nodes=8, gpus_per_node=8, gpu_memory_gib=80).problems
    assert any("in phase 'sync'" in p for p in on_h100)


def test_lora_on_an_moe_model_counts_peft_s_adapters_on_experts_and_routers(tmp_path):
    """PEFT's 'all-linear' on an MoE model adapts the stacked experts (one low-rank update per expert) and the
    routers as parameters; the plan counts exactly what PEFT builds."""
    from tiny_models import make_tiny_moe
    from transformers import AutoConfig, AutoModelForCausalLM

    from arctic_rl.config import LoraConfig
    from arctic_rl.engines.lora import apply_lora
    from arctic_rl.plan import lora_params, model_shape

    path = make_tiny_moe(tmp_path / "moe")
    m = model_shape(AutoConfig.from_pretrained(path), str(path))
    assert m.experts == 4 and len(m.stacked) == 2 * m.moe_layers and len(m.routers) == m.moe_layers
    for targets in ("all-linear", ["q_proj", "v_proj"]):
        lora = LoraConfig(rank=4, target_modules=targets)
        peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(path), lora)
        assert lora_params(m, lora) == sum(p.numel() for p in peft_model.parameters() if p.requires_grad), targets

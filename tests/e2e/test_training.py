"""DeepSpeed training through the client: ZeRO-1, 2 and 3 train the tiny model; 2 data-parallel workers
match 1 on the same global batch; a checkpoint restores log-probs and the next optimizer step exactly (loaded into
the deployment that saved it, after it trained on);
update_reference (reference := current policy) under each stage leaves the reference's log-probs equal to the
policy's (on the same deployments; tests/e2e/test_sleep.py checks it again on a partitioned 2-rank ZeRO-3
reference after sleep/wake); a load drops the gradient of a backward that was never stepped; a save over a
checkpoint that is killed midway (SIGKILL of the training engine) leaves the previous checkpoint whole."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.errors import EngineDeadError

pytestmark = pytest.mark.slow
STEPS = 3
DP_TOL = 2e-4  # fp32: 2 ranks sum gradients in a different order than 1


def fixed_batch() -> dict:
    """8 rows in 4 prompt groups of 2, left-padded prompts, ragged responses."""
    g = torch.Generator().manual_seed(0)
    P, R = 10, 8
    ids = torch.randint(3, 300, (8, P + R), generator=g)
    attn = torch.ones_like(ids)
    for i, pad in enumerate([0, 0, 3, 3, 1, 1, 5, 5]):  # the two rows of a group share their prompt
        attn[i, :pad] = 0
        ids[i, :pad] = 0
        ids[i, pad:P] = ids[i - i % 2, pad:P]
    for i, r in enumerate([8, 5, 8, 2, 6, 8, 3, 7]):
        attn[i, P + r :] = 0
        ids[i, P + r :] = 0
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "responses": ids[:, P:].clone(),
        "response_mask": attn[:, P:].clone(),
        "uid": [0, 0, 1, 1, 2, 2, 3, 3],
    }


def start(model, zero_stage: int, workers: int, checkpoint_root=None):
    return create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            training_gpus=workers,
            seed=0,
            training_config={
                "dtype": "float32",
                "zero_stage": zero_stage,
                "optimizer": {"lr": 1e-3},
                "micro_batch_size": 4,
            },
            vllm_config={"max_seq_len": 256, "dtype": "float32"},
            server={"checkpoint_root": str(checkpoint_root)} if checkpoint_root else {},
        )
    )


def assert_update_reference_copies_the_policy(client, batch) -> None:
    """After training, the reference (the initial weights) differs from the policy; update_reference makes
    them equal."""
    mask = batch["response_mask"].bool()
    policy = client.log_probs(batch)["log_probs"]
    assert (policy - client.log_probs(batch, reference=True)["log_probs"])[mask].abs().max() > 1e-3  # it moved
    client.update_reference()
    assert (policy - client.log_probs(batch, reference=True)["log_probs"])[mask].abs().max() < 1e-5


def train(client, batch, steps=STEPS) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(client.forward_backward(batch, "sft")["loss"])
        client.optimizer_step()
    return losses


@pytest.fixture(scope="module")
def reference_run(ray_cluster, tiny_llama, tmp_path_factory):
    """ZeRO-1, one worker: losses, final log-probs, and a checkpoint after step 2 with what step 3 gave."""
    batch = fixed_batch()
    ckpt = tmp_path_factory.mktemp("ckpt") / "step2"
    c = start(tiny_llama, 1, 1, checkpoint_root=ckpt.parent)  # the server saves under its checkpoint_root only
    try:
        losses = train(c, batch, STEPS - 1)
        c.save_checkpoint(str(ckpt))
        lp_at_ckpt = c.log_probs(batch)["log_probs"]
        m3 = c.forward_backward(batch, "sft")
        s3 = c.optimizer_step()
        losses.append(m3["loss"])
        final = c.log_probs(batch)["log_probs"]
        assert_update_reference_copies_the_policy(c, batch)  # after everything the fixture returns
    except BaseException:
        c.shutdown()
        raise
    yield {
        "client": c,  # kept for test_checkpoint_restores_log_probs_and_next_step
        "batch": batch,
        "losses": losses,
        "final": final,
        "ckpt": ckpt,
        "lp_at_ckpt": lp_at_ckpt,
        "loss3": m3["loss"],
        "grad_norm3": s3["grad_norm"],
    }
    c.shutdown()


def test_zero1_trains(reference_run):
    losses = reference_run["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_zero_stage_with_two_workers_matches_one(reference_run, tiny_llama, zero_stage, tmp_path):
    c = start(tiny_llama, zero_stage, 2, checkpoint_root=tmp_path)  # it saves the checkpoint it exports
    try:
        losses = train(c, reference_run["batch"])
        final = c.log_probs(reference_run["batch"])["log_probs"]
        c.save_checkpoint(str(tmp_path / "ckpt"))
        assert_update_reference_copies_the_policy(c, reference_run["batch"])
    finally:
        c.shutdown()
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses == pytest.approx(reference_run["losses"], abs=DP_TOL)
    mask = reference_run["batch"]["response_mask"].bool()
    assert (final - reference_run["final"])[mask].abs().max() < DP_TOL
    # `arctic-rl export` merges both ranks' partitions into the model the trainer computed with
    from transformers import AutoModelForCausalLM

    from arctic_rl.engines.forward import response_log_probs
    from arctic_rl.export import export

    model = AutoModelForCausalLM.from_pretrained(export(tmp_path / "ckpt", tmp_path / "hf"), attn_implementation="sdpa")
    with torch.no_grad():
        lp = response_log_probs(model, reference_run["batch"])["log_probs"]
    assert (lp - final)[mask].abs().max() < 1e-5


def test_checkpoint_restores_log_probs_and_next_step(reference_run):
    # On the run's own deployment, past step 3: every weight, optimizer moment and the step counter have moved
    # on since the checkpoint, so whatever the load left out shows. (A load into a fresh deployment, the
    # requeue case, is tests/e2e/test_jobs_multinode.py's preemption test.)
    c = reference_run["client"]
    c.load_checkpoint(str(reference_run["ckpt"]))
    batch = reference_run["batch"]
    mask = batch["response_mask"].bool()
    assert torch.equal(c.log_probs(batch)["log_probs"][mask], reference_run["lp_at_ckpt"][mask])
    m3 = c.forward_backward(batch, "sft")
    s3 = c.optimizer_step()
    assert m3["loss"] == reference_run["loss3"]
    assert s3["grad_norm"] == reference_run["grad_norm3"] and s3["step"] == STEPS
    assert torch.equal(c.log_probs(batch)["log_probs"][mask], reference_run["final"][mask])


def assert_load_drops_an_unstepped_gradient(c, batch, ckpt) -> None:
    """A backward never stepped, then a load: the next step applies the gradient taken after the load only (the
    same step as from a clean load). Before, DeepSpeed kept the old gradient and the step applied both."""
    c.load_checkpoint(str(ckpt))
    clean = (c.forward_backward(batch, "sft")["loss"], c.optimizer_step()["grad_norm"])
    c.forward_backward(batch, "sft")  # never stepped
    c.load_checkpoint(str(ckpt))
    after = (c.forward_backward(batch, "sft")["loss"], c.optimizer_step()["grad_norm"])
    assert after == clean


def test_load_checkpoint_drops_an_unstepped_gradient(reference_run):
    c, batch = reference_run["client"], reference_run["batch"]
    assert_load_drops_an_unstepped_gradient(c, batch, reference_run["ckpt"])
    mask = batch["response_mask"].bool()  # step 3, as from the checkpoint:
    assert torch.equal(c.log_probs(batch)["log_probs"][mask], reference_run["final"][mask])


def _files(root: Path) -> dict[str, int]:
    """Every file under `root` with its mtime (a file removed while walking, by a save that just ended, is left out)."""
    out = {}
    for d, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                out[os.path.join(d, name)] = os.stat(os.path.join(d, name)).st_mtime_ns
    return out


def _save_killed_at_its_first_file(client, root: Path, name: str) -> str:
    """Starts save_checkpoint(name) and SIGKILLs the training engine's process as soon as a file under `root` is
    new or rewritten. "killed": the save failed with the engine; "finished": it completed before any file was
    seen (the engine lives); "late": it completed before the kill (the engine is dead)."""
    pid = client.health()["engines"]["training[0]"]["pid"]
    before = _files(root)
    with ThreadPoolExecutor(1) as pool:
        save = pool.submit(client.save_checkpoint, name)
        while _files(root) == before:
            if save.done():
                save.result()
                return "finished"
            time.sleep(0.001)
        os.kill(pid, signal.SIGKILL)
        try:
            save.result()
        except EngineDeadError:
            return "killed"
    return "late"


def test_a_save_killed_midway_leaves_the_previous_checkpoint(reference_run, tiny_llama):
    """A deployment saves `ckpt`, trains on and saves over it; the training engine is SIGKILLed when the new save's
    first file appears. The next load (into another deployment on the same root) gets the previous checkpoint,
    whole. Before, DeepSpeed rewrote the files in place under the previous arctic_rl.json: the load took the new
    module states with the old optimizer, or failed on a half-written file."""
    root, batch = reference_run["ckpt"].parent, reference_run["batch"]
    outcome, saved = "late", None
    for _ in range(3):  # a deployment per try: only a save that ended before the kill needs another
        victim = start(tiny_llama, 1, 1, checkpoint_root=root)
        try:
            victim.save_checkpoint("overwritten")
            saved = victim.log_probs(batch)["log_probs"]
            for _ in range(3):
                train(victim, batch, 1)  # weights and Adam moments move on from the saved ones
                at_save = victim.log_probs(batch)["log_probs"]
                outcome = _save_killed_at_its_first_file(victim, root, "overwritten")
                if outcome != "finished":
                    break
                saved = at_save
        finally:
            victim.shutdown()
        if outcome == "killed":
            break
    assert outcome == "killed", "every save finished before its first file was seen: nothing was tested"
    c = reference_run["client"]
    c.load_checkpoint(str(root / "overwritten"))
    mask = batch["response_mask"].bool()
    assert torch.equal(c.log_probs(batch)["log_probs"][mask], saved[mask])
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["overwritten", "step2"]
    c.save_checkpoint("overwritten")  # the next save of the name removes what the killed one left (hidden)
    assert sorted(p.name for p in root.iterdir()) == ["overwritten", "step2"]


# -- arctic-rl export: the checkpoint above as a Hugging Face folder ------------------------------------------
@pytest.fixture(scope="module")
def exported(reference_run, tmp_path_factory):
    from arctic_rl.cli import main as cli

    out = tmp_path_factory.mktemp("export") / "step2-hf"
    assert cli(["export", str(reference_run["ckpt"]), "--out", str(out)]) == 0
    return out


def test_export_holds_exactly_the_trained_weights(reference_run, exported, tiny_llama):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arctic_rl.engines.forward import response_log_probs

    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in exported.iterdir()}
    assert not list(exported.parent.glob(".*tmp*"))  # nothing half-written next to it
    # zero_to_fp32 merged the fp32 master partitions; DeepSpeed also saved the module it trained (fp32 run:
    # the same numbers), read here without DeepSpeed's merging code.
    module = torch.load(
        reference_run["ckpt"] / "arctic-rl" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
    )["module"]
    weights = load_file(exported / "model.safetensors")
    assert set(weights) == {k.removeprefix("model.") for k in module}
    assert all(torch.equal(weights[k.removeprefix("model.")], v) for k, v in module.items())
    base = load_file(tiny_llama / "model.safetensors")
    assert not all(torch.equal(weights[k], base[k]) for k in base)  # trained, not the initial model
    # transformers loads it and computes the trainer's log-probs at the checkpoint
    model = AutoModelForCausalLM.from_pretrained(exported, attn_implementation="sdpa")
    assert model.dtype == torch.float32 and AutoTokenizer.from_pretrained(exported).chat_template
    batch = reference_run["batch"]
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        lp = response_log_probs(model, batch)["log_probs"]
    assert (lp - reference_run["lp_at_ckpt"])[mask].abs().max() < 1e-5
    # --dtype casts the same weights; the config says so, for whoever loads the folder
    from arctic_rl.cli import main as cli

    bf16 = exported.parent / "step2-bf16"
    assert cli(["export", str(reference_run["ckpt"]), "--out", str(bf16), "--dtype", "bfloat16"]) == 0
    weights = load_file(bf16 / "model.safetensors")
    assert all(torch.equal(weights[k.removeprefix("model.")], v.to(torch.bfloat16)) for k, v in module.items())
    assert AutoModelForCausalLM.from_pretrained(bf16).dtype == torch.bfloat16


def test_export_refuses_what_is_not_a_checkpoint(tmp_path, capsys):
    from arctic_rl.cli import main as cli

    (tmp_path / "ckpt").mkdir()
    assert cli(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 2
    assert "arctic_rl.json does not exist" in capsys.readouterr().err and not (tmp_path / "hf").exists()

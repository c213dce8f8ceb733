"""SkyRL <-> arctic-rl layout against skyrl-train 0.3.1's real preprocessing and TrainingInputBatch.
skyrl-train requires Python 3.12; its pure-torch modules (training_batch, dataset.preprocess) import on 3.11
from a --no-deps copy (.venv/skyrl-ref, see docs/frameworks.md); make setup installs it."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REF = Path(sys.executable).parent.parent / "skyrl-ref"
if REF.is_dir() and str(REF) not in sys.path:
    sys.path.append(str(REF))
import skyrl_train.training_batch  # noqa: E402,F401  (make setup installs it; missing = failure)
from skyrl_train.dataset.preprocess import convert_prompts_responses_to_batch_tensors  # noqa: E402
from skyrl_train.training_batch import TrainingInputBatch  # noqa: E402

from arctic_rl.batch import from_samples, validate_batch  # noqa: E402
from recipes.skyrl.layout import from_arctic, samples_to_generator_output, to_arctic  # noqa: E402

SAMPLES = [
    {"prompt_token_ids": [5, 6, 7], "token_ids": [9, 10], "logprobs": [-0.5, -0.25]},
    {"prompt_token_ids": [5, 6, 7], "token_ids": [11, 12, 13, 14], "logprobs": [-1.0, -2.0, -3.0, -4.0]},
    {"prompt_token_ids": [8], "token_ids": [15], "logprobs": [-0.125]},
    {"prompt_token_ids": [8], "token_ids": [16, 17, 18], "logprobs": [-0.1, -0.2, -0.3]},
]
UIDS = ["a", "a", "b", "b"]


class _Tok:
    pad_token_id = 0


def skyrl_batch() -> TrainingInputBatch:
    go = samples_to_generator_output(SAMPLES, [1.0, 0.0, 0.5, 0.0])
    seq, attn, resp_mask, rewards, loss_mask, lp = convert_prompts_responses_to_batch_tensors(
        _Tok(), go["prompt_token_ids"], go["response_ids"], go["rewards"], go["loss_masks"], go["rollout_logprobs"]
    )
    tib = TrainingInputBatch(
        {
            "sequences": seq,
            "attention_mask": attn,
            "response_mask": resp_mask,
            "rewards": rewards,
            "loss_mask": loss_mask,
            "rollout_logprobs": lp,
        }
    )
    tib.metadata = {"uids": UIDS, "response_length": resp_mask.shape[1]}
    return tib


def test_skyrl_batch_is_our_layout():
    tib = skyrl_batch()
    a = to_arctic(tib)
    validate_batch(a, ("input_ids", "attention_mask", "responses", "response_mask"))
    ours = from_samples(SAMPLES, UIDS, pad_token_id=0)
    for key in ("input_ids", "attention_mask", "responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(a[key].to(ours[key].dtype), ours[key]), key
    assert a["uid"] == UIDS
    assert a["input_ids"].data_ptr() == tib["sequences"].data_ptr()  # shared, not copied
    # the reward sits on each row's last response token
    assert tib["rewards"][0].tolist()[:2] == [0.0, 1.0] and tib["rewards"][2, 0] == 0.5


def test_round_trip_with_trainer_outputs():
    tib = skyrl_batch()
    R = tib.metadata["response_length"]
    tib["action_log_probs"] = -torch.rand(4, R)
    tib["base_action_log_probs"] = -torch.rand(4, R)
    tib["advantages"] = torch.randn(4, R)
    a = to_arctic(tib)
    assert torch.equal(a["old_log_probs"], tib["action_log_probs"]) and torch.equal(
        a["ref_log_prob"], tib["base_action_log_probs"]
    )
    back = from_arctic(a)
    for key in ("sequences", "attention_mask", "action_log_probs", "base_action_log_probs", "advantages"):
        assert torch.equal(back[key], tib[key]), key
    assert torch.equal(back["response_mask"], tib["response_mask"])
    # a mini-batch slice in SkyRL stays a valid arctic-rl batch
    sub = TrainingInputBatch({k: v[:2] for k, v in tib.items()})
    sub.metadata = {"uids": UIDS[:2], "response_length": R}
    validate_batch(to_arctic(sub), ("input_ids", "attention_mask", "responses", "response_mask"))

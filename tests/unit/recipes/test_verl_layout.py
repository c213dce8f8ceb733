"""verl <-> arctic-rl batch layout, against verl 0.9.1's real DataProto and its own padding converters
(verl.workers.utils.padding: what RayPPOTrainer applies before and after every worker call)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

VERL_REF = Path(sys.executable).parent.parent / "verl-ref"
if VERL_REF.is_dir() and str(VERL_REF) not in sys.path:
    sys.path.append(str(VERL_REF))

from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

from arctic_rl.batch import from_samples, validate_batch  # noqa: E402
from recipes.verl.layout import dataproto_to_samples, samples_to_dataproto, to_arctic, to_no_padding  # noqa: E402

PAD = 0
SAMPLES = [  # two prompts x two samples, ragged prompts and responses (one empty response)
    {"prompt_token_ids": [5, 6, 7], "token_ids": [9, 10], "logprobs": [-0.5, -0.25]},
    {"prompt_token_ids": [5, 6, 7], "token_ids": [11, 12, 13, 14], "logprobs": [-1.0, -2.0, -3.0, -4.0]},
    {"prompt_token_ids": [8], "token_ids": [15], "logprobs": [-0.125]},
    {"prompt_token_ids": [8], "token_ids": [16, 17, 18], "logprobs": [-0.1, -0.2, -0.3]},
]
UIDS = ["a", "a", "b", "b"]


def rollout(P=5, R=6) -> DataProto:
    dp = samples_to_dataproto(
        SAMPLES, P, R, PAD, scores=[1.0, 0.0, 0.5, 0.0], non_tensor={"uid": np.array(UIDS, dtype=object)}
    )
    return dp


def test_rollout_layout_matches_ours_and_verl():
    dp = rollout()
    td = dp.batch
    assert td["prompts"].tolist()[0] == [0, 0, 5, 6, 7] and td["prompts"].tolist()[2] == [0, 0, 0, 0, 8]
    assert td["responses"].tolist()[1] == [11, 12, 13, 14, 0, 0]
    assert torch.equal(td["input_ids"], torch.cat([td["prompts"], td["responses"]], 1))
    assert td["response_mask"].sum(1).tolist() == [2, 4, 1, 3]
    # rm_scores: the score sits on the last response token (verl's agent loop convention)
    assert td["rm_scores"][1].tolist() == [0, 0, 0, 0, 0, 0] and td["rm_scores"][0, 1] == 1.0
    assert td["rm_scores"][2, 0] == 0.5
    # position ids: verl's compute_position_id_with_mask
    from verl.utils.model import compute_position_id_with_mask

    assert torch.equal(td["position_ids"], compute_position_id_with_mask(td["attention_mask"]))
    # the same rows as our own from_samples, up to the wider padding
    ours = from_samples(SAMPLES, UIDS, pad_token_id=PAD)
    a = to_arctic(dp)
    validate_batch(a)
    for i in range(4):
        m_ours, m_verl = ours["attention_mask"][i].bool(), a["attention_mask"][i].bool()
        assert ours["input_ids"][i][m_ours].tolist() == a["input_ids"][i][m_verl].tolist()
        r = int(ours["response_mask"][i].sum())
        assert torch.equal(ours["rollout_log_probs"][i, :r], a["rollout_log_probs"][i, :r])
    assert a["uid"] == UIDS
    assert dataproto_to_samples(dp) == [{**s, "logprobs": pytest.approx(s["logprobs"])} for s in SAMPLES]


def test_to_arctic_shares_tensors_of_a_padded_dataproto():
    dp = rollout()
    dp.batch["old_log_probs"] = torch.randn(4, 6)
    dp.batch["advantages"] = torch.randn(4, 6)
    a = to_arctic(dp)
    for key in ("input_ids", "attention_mask", "responses", "response_mask", "old_log_probs", "advantages"):
        assert a[key].data_ptr() == dp.batch[key].data_ptr(), key  # no copy


def test_worker_tensordict_round_trip_through_verl_no_padding():
    """What a worker gets (left_right_2_no_padding) -> our batch -> [B, R] output -> nested -> verl's
    no_padding_2_padding gives back the same [B, R] values on response tokens."""
    dp = rollout()
    dp.batch["old_log_probs"] = torch.randn(4, 6)
    dp.batch["advantages"] = torch.randn(4, 6)
    padded = to_arctic(dp)
    td = left_right_2_no_padding(dp.to_tensordict())
    assert td["input_ids"].is_nested
    a = to_arctic(td)
    validate_batch(a)
    assert torch.equal(a["input_ids"], padded["input_ids"]) and a["uid"] == UIDS
    assert torch.equal(a["old_log_probs"], dp.batch["old_log_probs"])
    x = torch.randn(4, 6) * dp.batch["response_mask"]
    nested = to_no_padding(x, td)
    assert nested.is_nested and nested.offsets().diff().tolist() == dp.batch["attention_mask"].sum(1).tolist()
    back = no_padding_2_padding(nested, td)
    assert torch.equal(back * dp.batch["response_mask"], x)


def test_worker_output_reaches_trainer_as_old_log_probs():
    """The trainer's _compute_old_log_prob steps 4-5 on a worker output built by our helper."""
    dp = rollout()
    td = left_right_2_no_padding(dp.to_tensordict())
    lp = -torch.rand(4, 6) * dp.batch["response_mask"]
    out = tu.get_tensordict(
        {"log_probs": to_no_padding(lp, td), "entropy": to_no_padding(lp.abs(), td)},
        non_tensor_dict={"metrics": {"mfu": 0.0}},
    )
    assert tu.get(out, "metrics")["mfu"] == 0.0 and tu.get(out, "routed_experts") is None
    got = no_padding_2_padding(tu.get(out, "log_probs"), td)
    assert torch.allclose(got * dp.batch["response_mask"], lp)

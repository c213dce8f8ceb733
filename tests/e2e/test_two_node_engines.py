"""Two Ray nodes on one machine (ray.cluster_utils.Cluster: two raylets with different node resources):
a deployment's engines are dealt over both nodes (the training ranks too) and still work together (generate -> train -> sync)."""

from __future__ import annotations

import pytest
import torch
from frameworks import skip_if_run_on_two_hosts

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples

pytestmark = pytest.mark.slow


def test_engines_spread_over_two_nodes(tiny_llama, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    skip_if_run_on_two_hosts("tests/e2e/test_jobs_multinode.py (engines on both hosts of a real two-node Ray)")

    if ray.is_initialized():  # this process may be attached to the session's one-node cluster
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    try:
        c = create_arctic_rl_client(
            ArcticRLClientConfig(
                model_name=str(tiny_llama),
                training_gpus=2,
                training_config={"dtype": "float32"},
                vllm_config={"max_seq_len": 256, "dtype": "float32"},
            )
        )
        try:
            engines = c.health()["engines"]
            nodes = {e["node_id"] for e in engines.values()}
            assert len(nodes) == 2, engines  # both nodes host engines
            # The two DeepSpeed ranks sit on different nodes and met at rank 0's address.
            assert engines["training[0]"]["node_id"] != engines["training[1]"]["node_id"], engines
            samples = c.generate(["the quick brown fox"], {"n": 4, "max_tokens": 8, "seed": 0})
            batch = from_samples(samples, [0] * 4)
            batch["old_log_probs"] = c.log_probs(batch)["log_probs"]
            assert (batch["old_log_probs"] - batch["rollout_log_probs"])[
                batch["response_mask"].bool()
            ].abs().max() < 1e-4
            batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])
            c.forward_backward(batch)
            c.optimizer_step()
            assert c.sync_weights()["probe_max_abs_logprob_diff"] < 1e-3
        finally:
            c.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()

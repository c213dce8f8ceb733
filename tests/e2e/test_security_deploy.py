"""Who may run what on a running HTTP server (one deployment for the module): the token is in no
command line, record, checkpoint or log; checkpoint paths stay under the root and loads never unpickle
code; plugin losses and post-processors by name; engine bugs are engine errors; cross-site requests reach no
engine; /healthz answers while the sampler decodes; close() detaches.
tests/unit/arctic_rl/test_security.py checks the request rules without a deployment."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from arctic_rl import (
    ArcticRLClientConfig,
    BatchFormatError,
    ConfigError,
    UnknownNameError,
    create_arctic_rl_client,
    wire,
)
from arctic_rl.config import state_dir
from arctic_rl.errors import EngineError

pytestmark = pytest.mark.slow
TOKEN = "tok-deploy-5ecret-never-shown"
PORT = 7421


def fixed_batch() -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (4, 10), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "responses": ids[:, 6:].clone(),
        "response_mask": torch.ones(4, 4, dtype=torch.long),
        "uid": [0, 0, 1, 1],
    }


class Evil:
    """Unpickling it runs os.makedirs(marker)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker,)


@pytest.fixture(scope="module")
def served(ray_cluster, tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckroot")
    cfg = ArcticRLClientConfig(
        model_name=str(tiny_llama),
        comm_protocol="http",
        port=PORT,
        auth_token=TOKEN,
        training_config={"dtype": "float32", "zero_stage": 1, "optimizer": {"lr": 1e-3}, "micro_batch_size": 4},
        vllm_config={"max_seq_len": 256, "dtype": "float32"},
        server={"checkpoint_root": str(root), "loss_modules": ["tests.security_plugin"], "max_n": 4},
    )
    state = {"client": create_arctic_rl_client(cfg), "root": root.resolve()}
    state["proc"] = state["client"]._t.proc
    yield state
    state["client"].shutdown()
    state["proc"].wait(timeout=60)


def test_the_token_is_in_no_command_line_record_checkpoint_or_log(served):
    client, root = served["client"], served["root"]
    cmdline = Path(f"/proc/{served['proc'].pid}/cmdline").read_bytes()
    assert b"arctic_rl.server" in cmdline and TOKEN.encode() not in cmdline
    record = state_dir() / f"{client.config.job_id}.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600 and TOKEN not in record.read_text()
    out = client.save_checkpoint("step_1")  # relative: under the root
    assert out["path"] == str(root / "step_1")
    meta = (root / "step_1" / "arctic_rl.json").read_text()
    assert client.config.job_id in meta and TOKEN not in meta
    log = client._t.log_path
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert "serving job" in log.read_text() and TOKEN not in log.read_text()
    # The token still guards the server: the config a client gets back holds none, the client keeps its own.
    assert client.reconnect_config().auth_token == TOKEN
    assert httpx.post(f"http://127.0.0.1:{PORT}/v1/health").status_code == 401


def test_checkpoint_paths_stay_under_the_root(served, tmp_path):
    client, root = served["client"], served["root"]
    (root / "out").symlink_to(tmp_path)
    for path in (str(tmp_path / "ck"), "../escape", "out/ck"):
        with pytest.raises(ConfigError, match=f"outside the server's checkpoint_root '{root}'"):
            client.save_checkpoint(path)
        with pytest.raises(ConfigError, match="checkpoint_root"):
            client.load_checkpoint(path)
    assert list(tmp_path.iterdir()) == [] and not (root.parent / "escape").exists()


def test_a_checkpoint_holding_pickled_code_is_refused(served, tmp_path):
    client, root = served["client"], served["root"]
    batch = fixed_batch()
    client.save_checkpoint("good")
    lp = client.log_probs(batch)["log_probs"]
    client.forward_backward(batch, "sft")
    client.optimizer_step()
    assert client.load_checkpoint("good")["path"] == str(root / "good")  # a real checkpoint loads weights-only
    assert torch.equal(client.log_probs(batch)["log_probs"], lp)

    client.save_checkpoint("evil")
    marker = tmp_path / "code-ran"
    states = root / "evil" / "arctic-rl" / "mp_rank_00_model_states.pt"
    torch.save({"module": Evil(str(marker))}, states)
    with pytest.raises(ConfigError, match="refused to load .*mp_rank_00_model_states.pt"):
        client.load_checkpoint("evil")
    assert not marker.exists(), "loading a checkpoint ran code from it"
    assert client.health()["ok"]


def test_plugin_losses_and_post_processors_by_name(served, tmp_path):
    client = served["client"]
    batch = fixed_batch()
    m = client.forward_backward(batch, "plugin_sft")
    assert m["loss"] > 0
    full = client.log_probs(batch)["log_probs"]
    half = client.log_probs(batch, post_processor="plugin_half")["log_probs"]
    assert torch.allclose(half, full / 2)
    for name in ("tests.security_plugin:plugin_sft", "os:system"):
        with pytest.raises(UnknownNameError, match=r"'grpo'.*'plugin_sft'.*--allow-imports"):
            client.forward_backward(batch, name)
    with pytest.raises(UnknownNameError, match=r"unknown post_processor 'nope'.*'plugin_half'"):
        client.log_probs(batch, post_processor="nope")
    with pytest.raises(ConfigError, match=r"sampling_params\['n'\].*\[1, 4\]"):
        client.generate(["hi"], {"n": 5})
    # A string prompt longer than the window: the request's fault (4xx), found where it is tokenized.
    with pytest.raises(BatchFormatError, match=r"prompts\[1\] has \d+ tokens.*max_seq_len=256"):
        client.generate(["hi", "the quick brown fox " * 200], {"max_tokens": 2})
    # An exception inside the engine is an engine error (HTTP 500) with the engine's message.
    with pytest.raises(EngineError, match="bug in plugin_buggy"):
        client.forward_backward(batch, "plugin_buggy")
    assert client.health()["ok"]


def test_cross_site_requests_reach_no_engine(served):
    """The edges in front of the real controller: a request with the token and a valid body, but sent as a web
    page could (text/plain, a foreign Origin, a rebinding Host), is refused and its op never runs; the same request
    sent as the client sends it does run (so the refusal, not the body, is what stopped it)."""
    root, proc = served["root"], served["proc"]
    base = f"http://127.0.0.1:{PORT}"
    good = {"authorization": f"Bearer {TOKEN}", "content-type": wire.CONTENT_TYPE}
    save = wire.encode({"path": "xsite"})
    for bad, status in (
        ({"content-type": "text/plain"}, 415),
        ({"origin": "https://evil.example"}, 403),
        ({"sec-fetch-site": "cross-site"}, 403),
        ({"host": f"evil.example:{PORT}"}, 403),
    ):
        r = httpx.post(f"{base}/v1/save_checkpoint", content=save, headers={**good, **bad}, timeout=60)
        assert r.status_code == status, (bad, r.status_code, r.text[:200])
        assert not (root / "xsite").exists(), f"save_checkpoint ran despite {bad}"
        r = httpx.post(f"{base}/v1/shutdown", content=b"", headers={**good, **bad}, timeout=60)
        assert r.status_code == status, (bad, r.status_code, r.text[:200])
        time.sleep(1.0)  # a shutdown that got through stops the server 0.5 s after answering
        assert proc.poll() is None and served["client"].health()["ok"], f"shutdown ran despite {bad}"
    r = httpx.post(f"{base}/v1/save_checkpoint", content=save, headers=good, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert (root / "xsite" / "arctic_rl.json").exists()


def test_healthz_answers_while_the_deployment_decodes(served):
    """A long generate on the real sampler holds its request open; /healthz is answered meanwhile, each poll in a
    small fraction of the generate's time (a controller call waited on the event loop would hold every poll
    until the generate ends)."""
    client = served["client"]
    done: dict = {}

    def generate() -> None:
        t = time.monotonic()
        done["out"] = client.generate([f"count {i}:" for i in range(8)], {"n": 4, "max_tokens": 200, "min_tokens": 200})
        done["secs"] = time.monotonic() - t

    worker = threading.Thread(target=generate)
    worker.start()
    waits = []
    while worker.is_alive():
        t = time.monotonic()
        r = httpx.get(f"http://127.0.0.1:{PORT}/healthz", timeout=300)
        if worker.is_alive():  # answered while the generate was still running
            waits.append(time.monotonic() - t)
        assert r.status_code == 200
        time.sleep(0.05)
    worker.join()
    assert len(done["out"]) == 32 and all(len(o["token_ids"]) == 200 for o in done["out"])
    assert len(waits) >= 5 and max(waits) < done["secs"] / 4, (done["secs"], len(waits), max(waits, default=None))


def test_close_detaches_and_never_stops_the_server(served):
    """Last in the module: the fixture's client is replaced by one that re-attached."""
    client, proc = served["client"], served["proc"]
    cfg = client.reconnect_config()
    client.close()
    assert proc.poll() is None
    assert httpx.get(f"http://127.0.0.1:{PORT}/healthz", timeout=5).status_code == 200
    again = create_arctic_rl_client(cfg)
    served["client"] = again
    assert again.config.job_id == cfg.job_id and again.health()["ok"]
    assert proc.poll() is None

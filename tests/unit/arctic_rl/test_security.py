"""Who may run what on the server, checked without a deployment: the token never leaves the process
that holds it (config JSON, deployment records, MLflow params), request validation at the real
FastAPI app, loss and post-processor names, checkpoint paths. tests/e2e/test_security_deploy.py checks
the same rules against a running server."""

from __future__ import annotations

import stat

import pytest
import torch
from mlflow.tracking import MlflowClient

from arctic_rl import tracking
from arctic_rl.config import ArcticRLClientConfig, record_deployment
from arctic_rl.errors import BatchFormatError, ConfigError
from arctic_rl.loop.grpo import open_tracker
from arctic_rl.runconfig import parse_run_config

TOKEN = "tok-5ecret-do-not-leak"
MODEL = "org/model"  # a hub name: not looked up by the config


def test_the_token_is_never_serialized():
    cfg = ArcticRLClientConfig(model_name=MODEL, comm_protocol="http", host="0.0.0.0", auth_token=TOKEN)
    assert TOKEN not in cfg.to_json() and TOKEN not in repr(cfg) and TOKEN not in str(cfg.model_dump())
    back = ArcticRLClientConfig.from_json(cfg.to_json())  # what a record, a checkpoint or a server holds
    assert back.auth_token is None and back.host == "0.0.0.0"
    with pytest.raises(ConfigError, match="auth_token"):  # a new non-loopback config still needs one
        ArcticRLClientConfig(model_name=MODEL, comm_protocol="http", host="0.0.0.0")


def test_the_deployment_record_is_owner_only_and_holds_no_token(tmp_path, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("ARCTIC_RL_STATE_DIR", str(state))
    cfg = ArcticRLClientConfig(model_name=MODEL, comm_protocol="http", auth_token=TOKEN).with_new_job_id()
    record_deployment(cfg)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in (f"{cfg.job_id}.json", "latest.json"):
        f = state / name
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, name
        assert TOKEN not in f.read_text() and cfg.job_id in f.read_text()
    assert ArcticRLClientConfig.reconnect_config().job_id == cfg.job_id


def test_mlflow_params_of_a_run_hold_no_token(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = parse_run_config(
        {
            "model": {"name_or_path": MODEL},
            "recipe": {"name": "toy"},
            "train": {"steps": 1, "prompts_per_step": 1},
            "backend": {"comm_protocol": "http", "auth_token": TOKEN},
        }
    )
    tracker = open_tracker(cfg, None)
    tracker.end("FINISHED")
    run = MlflowClient(tracking.default_tracking_uri()).get_run(tracker.run_id)
    assert "backend/comm_protocol" in run.data.params  # the backend section is logged ...
    assert not any(TOKEN in v for v in run.data.params.values())  # ... without its token
    assert not any(TOKEN in v for v in run.data.tags.values())
    assert "backend/auth_token" not in run.data.params


# -- requests at the real FastAPI app (no deployment: a request that fails its checks never reaches one) --


def _app(tmp_path, **server):
    from fastapi.testclient import TestClient

    from arctic_rl.server.http import build_app

    cfg = ArcticRLClientConfig(
        model_name=MODEL,
        comm_protocol="http",
        auth_token=TOKEN,
        vllm_config={"max_seq_len": 512},
        server={"checkpoint_root": str(tmp_path / "root"), "max_n": 8, **server},
    )
    # handle=None: any request that got past the checks would fail with a 500, which the tests refuse.
    base = f"http://{cfg.host}:{cfg.port}"  # the Host the server is bound to (TestClient's own is refused)
    return TestClient(build_app(None, cfg), base_url=base, headers={"authorization": f"Bearer {TOKEN}"})


def _post(app, op: str, **kwargs):
    from arctic_rl import wire

    return app.post(f"/v1/{op}", content=wire.encode(kwargs), headers={"content-type": wire.CONTENT_TYPE})


def _batch(rows: int = 2):
    ids = torch.randint(1, 50, (rows, 6))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "responses": ids[:, 3:].clone(),
        "response_mask": torch.ones(rows, 3, dtype=torch.long),
        "uid": list(range(rows)),
    }


BAD_REQUESTS = [  # (op, arguments, the argument the answer must name)
    ("log_probs", {"batch": dict(_batch(), input_ids="not a tensor")}, "input_ids"),
    ("log_probs", {"batch": dict(_batch(), attention_mask=[[1, 1]])}, "attention_mask"),
    ("log_probs", {"batch": 7}, "batch"),
    ("log_probs", {"batch": dict(_batch(), old_log_probs=torch.zeros(2, 3, dtype=torch.long))}, "old_log_probs"),
    ("log_probs", {"batch": dict(_batch(), input_ids=_batch()["input_ids"].float())}, "input_ids"),
    ("log_probs", {"batch": dict(_batch(), uid=[{"a": 1}, 2])}, "uid"),
    ("log_probs", {"batch": _batch(), "temperature": float("nan")}, "temperature"),
    ("log_probs", {"batch": _batch(), "temperature": "hot"}, "temperature"),
    ("log_probs", {"batch": _batch(), "reference": "yes"}, "reference"),
    ("log_probs", {"batch": _batch(), "post_processor": 5}, "post_processor"),
    ("log_probs", {"batch": _batch(), "bogus": 1}, "bogus"),
    ("forward_backward", {"batch": _batch(), "loss_config": [1, 2]}, "loss_config"),
    ("forward_backward", {"batch": _batch(), "loss_fn": ["grpo"]}, "loss_fn"),
    ("generate", {"prompts": 5, "sampling_params": {}}, "prompts"),
    ("generate", {"prompts": "abc", "sampling_params": {}}, "prompts"),
    ("generate", {"prompts": [[1, -2]], "sampling_params": {}}, "prompts[0]"),
    ("generate", {"prompts": [[1] * 600], "sampling_params": {}}, "prompts[0]"),
    ("generate", {"prompts": ["hi"], "sampling_params": "n=2"}, "sampling_params"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"n": 10**9}}, "'n'"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"n": True}}, "'n'"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"n": float("nan")}}, "'n'"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"max_tokens": 10**12}}, "max_tokens"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"max_tokens": 1.5}}, "max_tokens"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"temperature": float("inf")}}, "temperature"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"stop": 5}}, "stop"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"seed": 10**30}}, "seed"),
    (
        "generate",
        {"prompts": ["hi"], "sampling_params": {"stop": ["x"] * 65}},
        "65 entries; the server takes at most 64",
    ),
    ("generate", {"prompts": ["hi"], "sampling_params": {"stop": ["ok", "y" * 257]}}, "['stop'][1] has 257 char"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"stop": "z" * 257}}, "server.max_stop_chars"),
    ("generate", {"prompts": ["hi"], "sampling_params": {"stop_token_ids": [1] * 65}}, "server.max_stops"),
    ("sampler_log_probs", {"sequences": [[1, 2, 3]], "prompt_lens": [float("nan")]}, "prompt_lens[0]"),
    ("sampler_log_probs", {"sequences": [[1, 2, 3]], "prompt_lens": [9]}, "prompt_lens[0]"),
    ("sampler_log_probs", {"sequences": 3, "prompt_lens": [1]}, "sequences"),
    ("sampler_log_probs", {"sequences": [[1, 2, 3], "ab"], "prompt_lens": [1, 1]}, "sequences[1]"),
    ("sampler_log_probs", {"sequences": [[1, 2]], "prompt_lens": [1, 1]}, "prompt_lens"),
    ("sleep", {"engine": ["training"]}, "engine"),
    ("sleep", {"engine": "sampling", "level": 3}, "level"),
    ("sleep", {"engine": "sampling", "level": True}, "level"),
    ("sleep", {"engine": "training", "level": 2}, "level"),
    ("save_checkpoint", {"path": 17}, "path"),
]


@pytest.mark.parametrize(
    "op,args,names", BAD_REQUESTS, ids=[f"{op}-{names}-{i}" for i, (op, _, names) in enumerate(BAD_REQUESTS)]
)
def test_a_malformed_request_is_a_4xx_naming_the_argument(tmp_path, op, args, names):
    r = _post(_app(tmp_path), op, **args)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert names in r.json()["message"], r.json()


def test_a_deployment_without_a_reference_refuses_reference_ops():
    from arctic_rl.server.requests import check_request

    cfg = ArcticRLClientConfig(model_name=MODEL, use_reference=False, vllm_config={"max_seq_len": 512})
    with pytest.raises(ConfigError, match=r"log_probs\(reference=True\): this deployment has no reference model"):
        check_request("log_probs", {"batch": _batch(), "reference": True}, cfg)
    with pytest.raises(ConfigError, match="update_reference: this deployment has no reference model"):
        check_request("update_reference", {}, cfg)
    check_request("log_probs", {"batch": _batch(), "reference": False}, cfg)
    with pytest.raises(ConfigError, match="reference_gpus=1 but use_reference=False"):
        ArcticRLClientConfig(model_name=MODEL, use_reference=False, reference_gpus=1)


def test_limits_come_from_the_server_config(tmp_path):
    app = _app(tmp_path, max_n=2, max_tokens=16, max_batch_rows=3)
    r = _post(app, "generate", prompts=["hi"], sampling_params={"n": 3})
    assert r.status_code == 422 and "[1, 2]" in r.json()["message"]
    r = _post(app, "generate", prompts=["hi"], sampling_params={"max_tokens": 17})
    assert r.status_code == 422 and "[1, 16]" in r.json()["message"]
    r = _post(app, "generate", prompts=["a", "b"], sampling_params={"n": 2})
    assert r.status_code == 422 and "max_batch_rows" in r.json()["message"]
    r = _post(app, "log_probs", batch=_batch(4))
    assert r.status_code == 422 and "max_batch_rows" in r.json()["message"]


def test_one_generate_s_output_is_budgeted(tmp_path):
    """prompts x n x max_tokens (vLLM's 16 when unset) within server.max_request_tokens, named with the product."""
    from arctic_rl.server.requests import check_request

    app = _app(tmp_path, max_request_tokens=1000)
    r = _post(app, "generate", prompts=["a"] * 4, sampling_params={"n": 2, "max_tokens": 200})
    assert r.status_code == 422, r.text[:300]
    assert "4 prompts x n=2 x max_tokens=200 = 1600 tokens" in r.json()["message"], r.text[:300]
    assert "server.max_request_tokens" in r.json()["message"] and "1000" in r.json()["message"]
    r = _post(app, "generate", prompts=["a"] * 40, sampling_params={"n": 2})
    assert r.status_code == 422 and "max_tokens=16 = 1280 tokens" in r.json()["message"], r.text[:300]
    cfg = ArcticRLClientConfig(model_name=MODEL, vllm_config={"max_seq_len": 512}, server={"max_request_tokens": 1000})
    check_request("generate", {"prompts": ["a"] * 4, "sampling_params": {"n": 2, "max_tokens": 125}}, cfg)


def test_the_body_size_limit_is_enforced(tmp_path):
    app = _app(tmp_path, max_body_bytes=4096)
    from arctic_rl import wire

    big = wire.encode({"batch": _batch(200)})
    assert len(big) > 4096
    wire_type = {"content-type": wire.CONTENT_TYPE}
    r = app.post("/v1/log_probs", content=big, headers=wire_type)
    assert r.status_code == 413 and r.json()["type"] == "TooLargeError" and "4096" in r.json()["message"]

    def chunks():  # no content-length: the server counts what arrives
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    r = app.post("/v1/log_probs", content=chunks(), headers=wire_type)
    assert r.status_code == 413 and r.json()["type"] == "TooLargeError"


# -- names: only the server's registry, dotted paths only with --allow-imports --------------------------

EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")
def fn(*args):
    return None
"""


def test_a_dotted_loss_or_post_processor_name_is_refused_without_importing(tmp_path, monkeypatch):
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil_loss_mod.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    app = _app(tmp_path)
    for name in ("evil_loss_mod:fn", "evil_loss_mod.fn", "os.system"):
        r = _post(app, "forward_backward", batch=_batch(), loss_fn=name)
        assert r.status_code == 422 and r.json()["type"] == "UnknownNameError", r.text
        assert "'grpo'" in r.json()["message"] and "--allow-imports" in r.json()["message"]
        r = _post(app, "log_probs", batch=_batch(), post_processor=name)
        assert r.status_code == 422 and r.json()["type"] == "UnknownNameError", r.text
        assert "'log_probs'" in r.json()["message"]
    r = _post(app, "forward_backward", batch=_batch(), loss_fn="nope")
    assert r.status_code == 422 and "'sft'" in r.json()["message"]
    assert not marker.exists(), "the server imported a module a request named"


def test_allow_imports_is_the_explicit_opt_in(tmp_path, monkeypatch):
    from arctic_rl.server.requests import check_request

    marker = tmp_path / "imported.txt"
    (tmp_path / "evil_loss_mod2.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = ArcticRLClientConfig(model_name=MODEL, server={"allow_imports": True, "checkpoint_root": str(tmp_path)})
    check_request("forward_backward", {"batch": _batch(), "loss_fn": "evil_loss_mod2:fn"}, cfg)
    assert marker.exists()


def test_loss_modules_register_the_names_requests_may_use(tmp_path, monkeypatch):
    from arctic_rl.losses import load_loss_modules
    from arctic_rl.server.requests import check_request

    (tmp_path / "my_losses_plugin.py").write_text(
        "from arctic_rl import register_loss_fn, register_post_processor\n"
        "@register_loss_fn('my_plugin_loss')\n"
        "def loss(outputs, batch, config):\n    raise NotImplementedError\n"
        "@register_post_processor('my_plugin_pp')\n"
        "def pp(logits, labels, config):\n    raise NotImplementedError\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = ArcticRLClientConfig(
        model_name=MODEL, server={"loss_modules": ["my_losses_plugin"], "checkpoint_root": str(tmp_path)}
    )
    load_loss_modules(cfg.server.loss_modules)
    check_request(
        "forward_backward", {"batch": _batch(), "loss_fn": "my_plugin_loss", "post_processor": "my_plugin_pp"}, cfg
    )
    with pytest.raises(ConfigError, match="loss_modules.*no_such_plugin_mod"):
        load_loss_modules(["no_such_plugin_mod"])


# -- checkpoint paths: under server.checkpoint_root only -------------------------------------------------


def test_checkpoint_paths_outside_the_root_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    app = _app(tmp_path)
    for op in ("save_checkpoint", "load_checkpoint"):
        for path in (
            str(outside / "ck"),
            "/etc",
            "../outside/ck",
            str(root / ".." / "outside"),
            "link/ck",
            str(root / "link"),
            "~/ck",
        ):
            r = _post(app, op, path=path)
            assert r.status_code == 422 and r.json()["type"] == "ConfigError", (op, path, r.text)
            assert f"checkpoint_root {str(root.resolve())!r}" in r.json()["message"], r.json()
    assert list(outside.iterdir()) == []


def test_checkpoint_paths_under_the_root_are_taken(tmp_path):
    from arctic_rl.server.requests import checkpoint_path

    cfg = ArcticRLClientConfig(model_name=MODEL, server={"checkpoint_root": str(tmp_path / "root")})
    root = (tmp_path / "root").resolve()
    assert checkpoint_path("step_1", cfg) == root / "step_1"
    assert checkpoint_path(str(root / "a" / ".." / "b"), cfg) == root / "b"
    assert checkpoint_path(str(root), cfg) == root


def test_checkpoint_root_defaults_to_the_job_folder_else_runs(tmp_path, monkeypatch):
    from arctic_rl.config import ServerConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARCTIC_RL_JOB_DIR", raising=False)
    assert ServerConfig().resolved().checkpoint_root == str(tmp_path.resolve() / "runs")
    monkeypatch.setenv("ARCTIC_RL_JOB_DIR", str(tmp_path / "job"))
    assert ServerConfig().resolved().checkpoint_root == str(tmp_path.resolve() / "job")
    assert ServerConfig(checkpoint_root=str(tmp_path / "x")).resolved().checkpoint_root == str(tmp_path / "x")


def test_the_loop_and_jobs_checkpoint_dirs_lie_under_the_root(tmp_path, monkeypatch):
    """The loop starts its server with the folder above checkpoint.dir as root: the job's folder for
    jobs (checkpoint.dir=<job>/checkpoints), runs/<recipe> by default."""
    from arctic_rl.server.requests import checkpoint_path

    monkeypatch.chdir(tmp_path)
    base = {"model": {"name_or_path": MODEL}, "recipe": {"name": "toy"}, "train": {"steps": 1, "prompts_per_step": 1}}
    for overrides in ([f"checkpoint.dir={tmp_path / 'job' / 'checkpoints'}"], []):
        run = parse_run_config(base, overrides)
        cc = run.client_config()
        assert checkpoint_path(str((run.checkpoint_dir / "step_1").resolve()), cc)
    assert parse_run_config(base, []).client_config().server.checkpoint_root == str(tmp_path.resolve() / "runs" / "toy")


def test_the_token_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ARCTIC_RL_TOKEN", TOKEN)
    cfg = ArcticRLClientConfig(model_name=MODEL, comm_protocol="http", host="0.0.0.0")
    assert cfg.auth_token == TOKEN and TOKEN not in cfg.to_json()


# -- every request's values, against the deployment's model (its vocabulary and max_seq_len) -------------------

SEQ = 128  # the deployment's vllm_config.max_seq_len in these tests


def _model_app(tmp_path, model):
    from fastapi.testclient import TestClient

    from arctic_rl.server.http import build_app

    cfg = ArcticRLClientConfig(
        model_name=str(model),
        comm_protocol="http",
        vllm_config={"max_seq_len": SEQ},
        server={"checkpoint_root": str(tmp_path / "root")},
    )
    base = f"http://{cfg.host}:{cfg.port}"  # the Host the server is bound to (TestClient's own is refused)
    return TestClient(build_app(None, cfg), base_url=base), cfg  # handle=None: a request past the checks is a 500


def _with(**changes):
    """_batch() with `changes` applied (a callable gets the batch and returns the new value)."""
    b = _batch()
    for k, v in changes.items():
        b[k] = v(b) if callable(v) else v
    return b


def _long_batch():
    ids = torch.randint(1, 50, (2, SEQ + 1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "responses": ids[:, -3:].clone()}


def test_rows_that_fit_are_taken_though_the_padded_columns_do_not():
    """A long prompt in one row and a long response in another: every row fits max_seq_len, the padded batch
    (longest prompt + longest response) does not. That is a valid batch (the reference loop makes them)."""
    from arctic_rl.batch import BatchLimits, validate_batch

    P, R = SEQ - 4, 8
    ids = torch.randint(1, 50, (2, P + R))
    mask = torch.ones_like(ids)
    mask[0, P + 4 :] = 0  # row 0: the long prompt, a 4-token response
    mask[1, : P - 10] = 0  # row 1: a short prompt, the long response
    batch = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, P:].clone()}
    assert validate_batch(batch, limits=BatchLimits(max_seq_len=SEQ)) == (2, P, R)
    mask[1, : P - 10] = 1  # row 1 now has P + R > SEQ tokens
    with pytest.raises(BatchFormatError, match=rf"row 1 has {P + R} tokens.*max_seq_len={SEQ}"):
        validate_batch(batch, limits=BatchLimits(max_seq_len=SEQ))


def _typed(dtype):
    b = _batch()
    b["input_ids"] = b["input_ids"].to(dtype)
    b["responses"] = b["input_ids"][:, 3:].clone()
    return b


def _out_of_vocab(vocab):
    b = _batch()
    b["input_ids"][0, 0] = vocab
    return b


BAD_VALUES = [  # (op, arguments from the vocabulary V, what the answer must name; VOCAB reads V)
    ("log_probs", lambda V: {"batch": _long_batch()}, ["input_ids", f"max_seq_len={SEQ}"]),
    ("log_probs", lambda V: {"batch": _typed(torch.bool)}, ["input_ids", "torch.bool", "int64"]),
    ("log_probs", lambda V: {"batch": _typed(torch.uint8)}, ["input_ids", "torch.uint8", "int64"]),
    ("log_probs", lambda V: {"batch": _out_of_vocab(V)}, ["input_ids", "[0, VOCAB)", "max VOCAB"]),
    (
        "log_probs",
        lambda V: {"batch": _with(position_ids=lambda b: torch.full_like(b["input_ids"], 10**9))},
        ["position_ids", f"max_seq_len={SEQ}", str(10**9)],
    ),
    (
        "forward_backward",
        lambda V: {"batch": _with(attention_mask=lambda b: -torch.ones_like(b["input_ids"]))},
        ["attention_mask", "0 or 1", "min -1"],
    ),
    ("forward_backward", lambda V: {"batch": _with(response_mask=lambda b: 2 * b["response_mask"])}, ["response_mask"]),
    ("log_probs", lambda V: {"batch": _with(extra_key=torch.zeros(2, 3))}, ["extra_key", "input_ids"]),
    ("generate", lambda V: {"prompts": ["x" * (16 * SEQ + 1)]}, ["prompts[0]", "max_prompt_chars", str(16 * SEQ)]),
    ("generate", lambda V: {"prompts": [[1, V]]}, ["prompts[0]", "< VOCAB"]),
    (
        "generate",
        lambda V: {"prompts": ["hi"], "sampling_params": {"min_tokens": 9, "max_tokens": 4}},
        ["min_tokens=9", "max_tokens=4"],
    ),
    ("generate", lambda V: {"prompts": ["hi"], "sampling_params": {"min_tokens": 20}}, ["min_tokens=20", "16"]),
    (
        "forward_backward",
        lambda V: {"batch": _batch(), "loss_fn": "sft", "loss_config": {"temperature": 0.0}},
        ["loss_config['temperature']", "> 0"],
    ),
    (
        "forward_backward",
        lambda V: {"batch": _batch(), "loss_fn": "grpo", "loss_config": {"temperature": -1}},
        ["loss_config['temperature']"],
    ),
]


@pytest.mark.parametrize(
    "op,args,names", BAD_VALUES, ids=[f"{op}-{n[0]}-{i}" for i, (op, _, n) in enumerate(BAD_VALUES)]
)
def test_a_value_outside_the_models_limits_is_a_4xx_naming_it(tmp_path, tiny_llama, op, args, names):
    from arctic_rl.config import model_vocab_size

    app, cfg = _model_app(tmp_path, tiny_llama)
    vocab = model_vocab_size(str(tiny_llama), {})
    assert vocab is not None and vocab < 1000  # from the model's config.json, as the server reads it
    kwargs = args(vocab)
    kwargs.setdefault("sampling_params", {}) if op == "generate" else None
    r = _post(app, op, **kwargs)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    for name in names:
        assert name.replace("VOCAB", str(vocab)) in r.json()["message"], (name, r.json())


def test_the_controllers_checks_count_a_string_prompts_tokens(tiny_llama):
    """What the controller runs on every op (both transports) raises the typed error itself: a string prompt is
    counted by the model's tokenizer before a sampler sees it."""
    from transformers import AutoTokenizer

    from arctic_rl.server.requests import check_request

    cfg = ArcticRLClientConfig(model_name=str(tiny_llama), vllm_config={"max_seq_len": SEQ})
    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    words = "the quick brown fox " * 40  # under max_prompt_chars, over SEQ tokens
    assert len(words) <= 16 * SEQ and len(tok.encode(words)) >= SEQ

    def count(p):
        return len(tok.encode(p))

    with pytest.raises(BatchFormatError, match=rf"prompts\[1\] has {count(words)} tokens.*max_seq_len={SEQ}"):
        check_request("generate", {"prompts": ["hi", words], "sampling_params": {}}, cfg, 512, count)
    check_request("generate", {"prompts": ["hi"], "sampling_params": {}}, cfg, 512, count)
    with pytest.raises(BatchFormatError, match=r"batch\['position_ids'\] holds values outside"):
        check_request("log_probs", {"batch": _with(position_ids=lambda b: b["input_ids"] * 0 + SEQ)}, cfg, 512)


def test_a_zero_temperature_in_the_loss_config_would_make_the_loss_nan():
    """Why the check exists: the post-processor divides the logits by loss_config['temperature']."""
    from arctic_rl.losses.postprocess import log_probs_and_entropy

    # Positive logits: divided by 0 every one is +inf, and inf - inf is NaN (with random signs a row could end at
    # -inf instead, and whether any row does depended on the RNG state the tests before left).
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.rand(4, 10, generator=g) + 0.1, torch.randint(0, 10, (4,), generator=g)
    assert torch.isnan(log_probs_and_entropy(logits, labels, {"temperature": 0.0})["log_probs"]).all()
    assert torch.isfinite(log_probs_and_entropy(logits, labels, {"temperature": 1.0})["log_probs"]).all()


@pytest.mark.parametrize(
    "keys, match",
    [
        (["a"], r"routing_keys must be a list of one string per prompt \(2\)"),
        ("ab", r"routing_keys must be a list"),
        (["a", ""], r"routing_keys\[1\] must be a string of 1-200 characters"),
        (["a", "x" * 201], r"routing_keys\[1\] must be a string of 1-200 characters"),
        (["a", 7], r"routing_keys\[1\]"),
    ],
)
def test_generate_routing_keys_are_checked(keys, match):
    from arctic_rl.server.requests import check_request

    cfg = ArcticRLClientConfig(model_name="m", vllm_config={"max_seq_len": 64})
    with pytest.raises(BatchFormatError, match=match):
        check_request("generate", {"prompts": [[1, 2], [3]], "sampling_params": {}, "routing_keys": keys}, cfg, 512)
    check_request("generate", {"prompts": [[1, 2], [3]], "sampling_params": {}, "routing_keys": ["a", "a"]}, cfg, 512)

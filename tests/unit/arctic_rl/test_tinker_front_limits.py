"""The Tinker front's limits at its real routes (FastAPI, the SDK's own types and protobuf codecs), without a
deployment: hostile bodies are refused when sent (4xx naming the field and the limit), before anything is
allocated or queued; sessions end by finish or by missing heartbeats (a clock the test moves); futures are
cancelled, bounded by bytes and age, and never evicted while running. tests/e2e/test_tinker_front.py drives
the same front with the SDK against a deployment."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto

from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.server import tinker_api

SEQ = 128


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


PROTO = {"content-type": tinker_api.PROTO}  # what the SDK sends a forward_backward as


def _refuse(op, args):  # what runs an op: no deployment here, so nothing may get this far
    raise AssertionError(f"op {op} reached the controller")


def _front(tmp_path, model, call=_refuse, **server):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from arctic_rl.server.http import read_bytes

    cfg = ArcticRLClientConfig(
        model_name=str(model),
        comm_protocol="http",
        vllm_config={"max_seq_len": SEQ},
        server={"checkpoint_root": str(tmp_path / "root"), "max_n": 8, **server},
    )
    app, clock = FastAPI(), Clock()
    front = tinker_api.mount(app, cfg, call, lambda r: read_bytes(r, cfg.server.max_body_bytes), clock)
    return TestClient(app), front, clock


def _session(app) -> str:
    r = app.post("/api/v1/create_session", json={"tags": [], "user_metadata": None, "sdk_version": "0.38.0"})
    assert r.status_code == 200, r.text
    return r.json()["session_id"]


def _datum(n: int, **inputs) -> types.Datum:
    ids = list(range(1, n + 1))
    loss_inputs = {"target_tokens": np.asarray(ids[1:] + [1], dtype=np.int64), **inputs}
    if "weights" not in inputs:
        loss_inputs["weights"] = np.ones(n, dtype=np.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(ids), loss_fn_inputs=loss_inputs)


def _fb_body(data, loss_fn="cross_entropy") -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn), model_id="s:train:0", seq_id=0
    )
    return forward_backward_request_to_proto(req).SerializeToString()


def _sparse_body(shape: int) -> bytes:
    """A forward_backward whose `weights` is a sparse tensor declaring `shape` elements (one stored)."""
    msg = pb.ForwardBackwardRequest(model_id="s:train:0", loss_fn="cross_entropy")
    d = msg.data.add()
    d.model_input.add().encoded_text.tokens = np.asarray([1, 2], np.int32).tobytes()
    t = d.loss_fn_inputs["target_tokens"]
    t.dtype, t.dense = pb.DTYPE_INT64, np.asarray([2, 3], np.int64).tobytes()
    t.shape.append(2)
    w = d.loss_fn_inputs["weights"]
    w.dtype = pb.DTYPE_FLOAT32
    w.shape.extend([1, shape])
    w.sparse_csr.crow_indices = np.asarray([0, 1], np.int64).tobytes()
    w.sparse_csr.col_indices = np.asarray([shape - 1], np.int64).tobytes()
    w.sparse_csr.values = np.asarray([1.0], np.float32).tobytes()
    return msg.SerializeToString()


def test_a_sparse_tensor_declaring_a_huge_shape_is_refused_before_it_is_densified(tmp_path, tiny_llama):
    app, _, _ = _front(tmp_path, tiny_llama)
    body = _sparse_body(40_000_000)  # 160 MB once dense
    assert len(body) < 200
    r = app.post("/api/v1/forward_backward", content=body, headers=PROTO)
    assert r.status_code == 422, r.text
    assert "loss_fn_inputs['weights']" in r.json()["detail"] and f"max_seq_len={SEQ}" in r.json()["detail"]


def test_padding_to_the_longest_datum_is_bounded_before_the_batch_is_built(tmp_path, tiny_llama):
    app, _, _ = _front(tmp_path, tiny_llama, max_batch_tokens=1000)
    data = [_datum(SEQ - 1)] + [_datum(2) for _ in range(20)]  # 21 rows x 128 columns, from ~170 tokens
    r = app.post("/api/v1/forward_backward", content=_fb_body(data), headers=PROTO)
    assert r.status_code == 422 and "server.max_batch_tokens" in r.json()["detail"] and "1000" in r.json()["detail"]
    r = app.post(
        "/api/v1/forward_backward", content=_fb_body([_datum(SEQ)]), headers=PROTO
    )  # input + last target > SEQ
    assert r.status_code == 422 and "data[0].model_input has 128 tokens" in r.json()["detail"]
    app, _, _ = _front(tmp_path, tiny_llama, max_batch_rows=4)
    r = app.post("/api/v1/forward_backward", content=_fb_body([_datum(3)] * 5), headers=PROTO)
    assert r.status_code == 422 and "server.max_batch_rows" in r.json()["detail"]


def test_unknown_loss_fn_inputs_are_refused_naming_the_known_ones(tmp_path, tiny_llama):
    app, _, _ = _front(tmp_path, tiny_llama)
    data = [_datum(4, mask=np.ones(4, dtype=np.float32))]
    r = app.post("/api/v1/forward_backward", content=_fb_body(data), headers=PROTO)
    assert r.status_code == 422, r.text
    assert "['mask']" in r.json()["detail"] and "['target_tokens', 'weights']" in r.json()["detail"]


def test_asample_over_max_n_is_refused_when_sent(tmp_path, tiny_llama):
    app, front, _ = _front(tmp_path, tiny_llama)
    session = _session(app)
    r = app.post(
        "/api/v1/create_sampling_session",
        json={"session_id": session, "sampling_session_seq_id": 0, "base_model": str(tiny_llama)},
    )
    sampler = r.json()["sampling_session_id"]
    body = {
        "sampling_session_id": sampler,
        "seq_id": 0,
        "num_samples": 300_000,
        "prompt": types.ModelInput.from_ints([1, 2, 3]).model_dump(mode="json"),
        "sampling_params": {"max_tokens": 4},
    }
    r = app.post("/api/v1/asample", json=body)
    assert r.status_code == 422 and "sampling_params['n']" in r.json()["detail"] and "[1, 8]" in r.json()["detail"]
    r = app.post(
        "/api/v1/asample",
        json={**body, "num_samples": 2, "prompt": types.ModelInput.from_ints([1] * SEQ).model_dump(mode="json")},
    )
    assert r.status_code == 422 and f"max_seq_len={SEQ}" in r.json()["detail"]
    assert not front.futures.entries  # nothing queued


def test_sessions_end_by_finish_or_missing_heartbeats_and_free_what_they_held(tmp_path, tiny_llama):
    app, front, clock = _front(tmp_path, tiny_llama, tinker_session_ttl_s=60, tinker_max_sessions=2)

    def sampling_session(session):
        body = {"session_id": session, "sampling_session_seq_id": 0, "base_model": str(tiny_llama)}
        return app.post("/api/v1/create_sampling_session", json=body)

    a, b = _session(app), _session(app)
    assert (
        app.post("/api/v1/create_session", json={"tags": [], "user_metadata": None, "sdk_version": "x"}).status_code
        == 429
    )
    assert sampling_session(a).status_code == 200 and sampling_session(b).status_code == 200
    for _ in range(3):  # heartbeats keep `a` open past the ttl; `b` sends none
        clock.t += 40
        assert app.post("/api/v1/session_heartbeat", json={"session_id": a}).status_code == 200
    r = app.post("/api/v1/session_heartbeat", json={"session_id": b})
    assert r.status_code == 410 and "server.tinker_session_ttl_s" in r.json()["detail"]  # the SDK stops on 410
    assert sampling_session(b).status_code == 410
    assert [k.split(":")[0] for k in front.state.samplers] == [a]  # b's sampling session was freed
    assert app.post(f"/api/v1/sessions/{a}/finish", json={"reason": {"type": "success"}}).status_code == 200
    assert app.post("/api/v1/session_heartbeat", json={"session_id": a}).status_code == 410
    assert not front.state.samplers and not front.state.sessions
    assert sampling_session("made-up-session").status_code == 410  # maps are keyed by sessions the server opened


def test_a_cancelled_future_that_has_not_started_never_runs(tmp_path, tiny_llama):
    app, front, _ = _front(tmp_path, tiny_llama)
    gate, ran = threading.Event(), []
    first = front.submit(front.train, lambda: gate.wait(30) and types.OptimStepResponse(metrics={}), session="s")
    second = front.submit(front.train, lambda: ran.append(1), session="s")
    r = app.post("/api/v1/cancel_future", json={"request_id": second["request_id"]})
    assert r.status_code == 200
    assert app.post("/api/v1/cancel_future", json={"request_id": "nope"}).status_code == 404
    gate.set()
    r = app.post("/api/v1/retrieve_future", json={"request_id": first["request_id"]})
    assert r.status_code == 200 and r.json()["metrics"] == {}  # the running one finished
    r = app.post("/api/v1/retrieve_future", json={"request_id": second["request_id"]})
    assert r.json()["category"] == "user" and "cancelled" in r.json()["error"]
    front.train.submit(lambda: None).result()  # the queue drained
    assert ran == []


def test_running_futures_are_never_evicted_and_results_are_bounded_by_bytes_and_age(tmp_path):
    clock, pool = Clock(), ThreadPoolExecutor(4)
    store = tinker_api.FutureStore(max_pending=2, max_bytes=2500, ttl_s=100, clock=clock)
    gate = threading.Event()
    store.add("running", lambda: pool.submit(gate.wait, 30), "s")
    for i in range(3):  # 1000-byte results: the third pushes the oldest out, by bytes
        store.add(f"r{i}", lambda: pool.submit(lambda: tinker_api.Proto(b"x" * 1000)), "s")
        store.get(f"r{i}").result()
    assert store.get("r0") is None and store.get("r1") is not None and store.get("r2") is not None
    assert store.get("running") is not None and not store.get("running").done()
    store.add("also-running", lambda: pool.submit(gate.wait, 30), "s")
    with pytest.raises(tinker_api.TooManyError, match="server.tinker_max_pending"):  # refused, nothing evicted
        store.add("third", lambda: pool.submit(gate.wait, 30), "s")
    clock.t += 101
    assert store.get("r1") is None and store.get("r2") is None  # past the ttl
    assert store.get("running") is not None  # running: kept whatever its age
    gate.set()
    pool.shutdown()


def test_a_checkpoint_path_stays_inside_the_tinker_folder(tmp_path, tiny_llama):
    """`tinker://<run>/weights/<name>` names a folder under `<checkpoint_root>/tinker/`; a run or name of `.` or `..`
    (which the SDK's parser takes) is refused when sent, naming the path, before any op; a good one reaches the
    op's own path check (requests.check_request, what the controller runs) under tinker/."""
    from arctic_rl.server.requests import check_request, checkpoint_path

    calls = []

    def call(op, args):
        check_request(op, args, cfg)
        calls.append((op, checkpoint_path(args["path"], cfg)))
        return {}

    app, _, _ = _front(tmp_path, tiny_llama, call)
    cfg = ArcticRLClientConfig(model_name=str(tiny_llama), server={"checkpoint_root": str(tmp_path / "root")})
    session = _session(app)
    body = {"session_id": session, "model_seq_id": 0, "base_model": str(tiny_llama), "optimizer": True}
    for bad in ("tinker://../weights/x", "tinker://./weights/x", "tinker://run/weights/..", "tinker://run/weights/."):
        r = app.post("/api/v1/load_weights", json={**body, "path": bad})
        assert r.status_code == 422, (bad, r.status_code, r.text)
        assert repr(bad) in r.json()["detail"], r.text
    assert calls == []
    good = f"tinker://{session}:train:0/weights/step-1"
    r = app.post("/api/v1/load_weights", json={**body, "path": good})
    assert r.status_code == 200, r.text
    r = app.post("/api/v1/retrieve_future", json={"request_id": r.json()["request_id"]})
    assert r.status_code == 200 and r.json()["path"] == good, r.text
    assert calls == [("load_checkpoint", (tmp_path / "root" / "tinker" / f"{session}_train_0" / "step-1").resolve())]

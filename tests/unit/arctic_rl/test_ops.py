"""The op set is declared once (arctic_rl/ops.py): every declared op has a client method, an HTTP route and a
controller method taking the declared arguments, and the deployment constants are written nowhere else."""

import ast
import inspect
from pathlib import Path

import pytest
from repo_paths import REPO

from arctic_rl import ops
from arctic_rl.client.client import ArcticRLClient
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import ProtocolError
from arctic_rl.server.controller import Controller

PACKAGE = REPO / "arctic_rl"
OPS = sorted(ops.OPS)


def _params(fn) -> list[inspect.Parameter]:
    # `ray.remote(Controller)` anywhere in this process (the e2e tests deploy in-process) adds Ray's tracing
    # keyword `_ray_trace_ctx` to the class's methods in place; it is Ray's, not the op's.
    return [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "_ray_trace_ctx")]


@pytest.mark.parametrize("name", OPS)
def test_the_controller_method_takes_the_declared_arguments(name):
    op = ops.OPS[name]
    got = [(p.name, p.default) for p in _params(getattr(Controller, name))]
    assert got == [(a.name, a.default) for a in op.args]


@pytest.mark.parametrize("name", OPS)
def test_the_client_method_takes_the_declared_arguments(name):
    """Same names in the same order; where the op has a default the client's is the same (the client may give
    a default where the wire has none, e.g. generate's sampling_params)."""
    params = _params(getattr(ArcticRLClient, name))
    assert [p.name for p in params] == [a.name for a in ops.OPS[name].args]
    for p, a in zip(params, ops.OPS[name].args):
        if a.default is not ops.REQUIRED:
            assert p.default == a.default, (name, a.name)


def test_every_op_has_an_http_route_and_nothing_else_does(tmp_path):
    from arctic_rl.server.http import build_app

    app = build_app(None, ArcticRLClientConfig(model_name="unused", server={"checkpoint_root": str(tmp_path)}))
    routes = {r.path for r in app.routes if "POST" in getattr(r, "methods", ())}
    assert routes == {ops.route(n) for n in OPS} | {ops.route("{name}")}  # the catch-all answers 404


def test_bind_names_unknown_and_missing_arguments():
    with pytest.raises(ProtocolError, match=r"\['bogus'\]"):
        ops.OPS["log_probs"].bind({"bogus": 1})
    with pytest.raises(ProtocolError, match="batch"):
        ops.OPS["log_probs"].bind({})
    with pytest.raises(ProtocolError, match="no_such_op"):
        ops.lookup("no_such_op")
    assert ops.OPS["forward_backward"].bind({"batch": {}}) == {
        "batch": {},
        "loss_fn": "grpo",
        "loss_config": None,
        "post_processor": "log_probs",
    }


def _modules() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def _code_strings(tree: ast.Module) -> list[str]:
    """String constants in code (f-string parts included), docstrings left out."""
    docs = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_the_deployment_constants_are_written_only_in_ops():
    ops_py = PACKAGE / "ops.py"
    for path, tree in _modules().items():
        if path == ops_py:
            continue
        where = path.relative_to(REPO)
        for s in _code_strings(tree):
            assert "controller-" not in s and not s.startswith(ops.ROUTE_PREFIX), (where, s)
        for n in ast.walk(tree):
            if isinstance(n, ast.keyword) and n.arg == "namespace":  # Ray's namespace=: always ops.NAMESPACE
                assert ast.unparse(n.value).endswith("NAMESPACE"), (where, ast.unparse(n))
            if isinstance(n, ast.Assign):
                names = {t.id for t in n.targets if isinstance(t, ast.Name)}
                assert not names & {"NAMESPACE", "OPS", "ROUTE_PREFIX"}, (where, names)


def test_ops_imports_nothing_of_the_server_or_engines():
    """The client imports ops.py; the client runs where no engine code may be imported."""
    tree = ast.parse((PACKAGE / "ops.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith(("arctic_rl.server", "arctic_rl.engines", "torch"))]


def _op_names_used(path: Path, call: str | None) -> set[str]:
    """Op names written as strings: the first argument of `self.<call>(...)`, or (call None) the strings `op`
    is compared with."""
    names = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if call and isinstance(n, ast.Call) and ast.unparse(n.func) == f"self.{call}" and n.args:
            names.add(ast.literal_eval(n.args[0]))
        if call is None and isinstance(n, ast.Compare) and ast.unparse(n.left) == "op":
            for c in n.comparators:
                value = ast.literal_eval(c)
                names.update([value] if isinstance(value, str) else value)
    return names


def test_the_client_and_the_request_checks_name_only_declared_ops():
    used = _op_names_used(PACKAGE / "client" / "client.py", "_call")
    assert used == set(OPS)  # every op has a client method that sends it, and no method sends another
    checked = _op_names_used(PACKAGE / "server" / "requests.py", None)
    assert checked and checked <= set(OPS), checked - set(OPS)

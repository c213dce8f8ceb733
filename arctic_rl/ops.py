"""The op set, declared once: each op's name, arguments (name, type, default) and what it returns, and the
constants a client needs to reach a deployment (Ray namespace, controller actor name, HTTP route prefix).

Everything else takes the ops from here: the client's methods (arctic_rl/client/client.py) bind their
arguments against `OPS` before either transport sends them; the HTTP server generates one `POST /v1/<op>`
route per op (arctic_rl/server/http.py); the Ray transport and those routes both call the controller's
`dispatch(op, kwargs)`, which binds the arguments again, runs the value checks of arctic_rl/server/requests.py
(types, shapes, limits, registry names, checkpoint paths) and calls the controller method named after the op.
Adding an op: one entry here, its controller method (and engine method), its client method;
tests/unit/arctic_rl/test_ops.py fails until all of them exist with the arguments declared here.

Imported by the client, so it imports nothing from arctic_rl.server or arctic_rl.engines (nor torch).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from arctic_rl.errors import ProtocolError

NAMESPACE = "arctic-rl"  # the Ray namespace of every deployment's controller actor
ROUTE_PREFIX = "/v1"  # HTTP: op `x` is `POST /v1/x`, its body a wire message of x's keyword arguments

REQUIRED = inspect.Parameter.empty


def controller_name(job_id: str) -> str:
    """The name of a deployment's controller: a detached Ray actor in NAMESPACE."""
    return f"controller-{job_id}"


def route(op: str) -> str:
    return f"{ROUTE_PREFIX}/{op}"


@dataclass(frozen=True)
class Arg:
    name: str
    type: str  # the annotation the controller's method carries (the value checks are server/requests.py's)
    default: Any = REQUIRED


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Arg, ...]
    returns: str
    doc: str

    @property
    def signature(self) -> inspect.Signature:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature(
            [inspect.Parameter(a.name, kind, default=a.default, annotation=a.type) for a in self.args]
        )

    def bind(self, kwargs: dict) -> dict[str, Any]:
        """The call's arguments with the defaults filled in; a ProtocolError names an unknown or missing one."""
        known = [a.name for a in self.args]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise ProtocolError(f"unknown argument(s) {unknown} for {self.name}; expected some of {known}")
        try:
            bound = self.signature.bind(**kwargs)
        except TypeError as e:
            raise ProtocolError(f"bad arguments for {self.name}: {e}") from None
        bound.apply_defaults()
        return dict(bound.arguments)


_BATCH = Arg("batch", "Batch")
_POST_PROCESSOR = Arg("post_processor", "str", "log_probs")
_ENGINE = Arg("engine", "str")  # "training" | "reference" | "sampling"
_PATH = Arg("path", "str")  # under the server's checkpoint_root (relative: taken under it)

OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            "generate",
            (Arg("prompts", "list"), Arg("sampling_params", "dict"), Arg("routing_keys", "list | None", None)),
            "list[dict]",
            "len(prompts) * n samples, prompt-major: prompt_token_ids, token_ids, text, logprobs, finish_reason, "
            "num_cached_tokens; a prompt's routing key (a conversation) keeps it on one sampler replica",
        ),
        Op(
            "sampler_log_probs",
            (Arg("sequences", "list[list[int]]"), Arg("prompt_lens", "list[int]")),
            "list[list[float]]",
            "the sampler's log-probs of the tokens after each sequence's prompt",
        ),
        Op(
            "log_probs",
            (
                _BATCH,
                Arg("reference", "bool", False),
                Arg("compute_entropy", "bool", False),
                Arg("temperature", "float", 1.0),
                _POST_PROCESSOR,
            ),
            "dict[str, torch.Tensor]",
            '{"log_probs": [B, R], "entropy": [B, R]?} from the trainer or the reference model',
        ),
        Op(
            "forward_backward",
            (_BATCH, Arg("loss_fn", "str", "grpo"), Arg("loss_config", "dict | None", None), _POST_PROCESSOR),
            "dict[str, float]",
            "accumulates the loss's gradients over the batch; its metrics",
        ),
        Op(
            "optimizer_step",
            (Arg("optim_params", "dict | None", None),),
            "dict[str, float]",
            'applies the accumulated gradients; {"grad_norm", "lr", "step"}; optim_params (lr, betas, eps, '
            "weight_decay) set the optimizer's hyper-parameters from this step on",
        ),
        Op("sync_weights", (), "dict[str, float]", "trainer weights -> every sampler replica, checked exactly"),
        Op("update_reference", (), "dict[str, float]", "reference model := current policy"),
        Op(
            "sleep",
            (_ENGINE, Arg("level", "int | None", None)),
            "dict",
            "moves an engine's device memory to the host until wake; level (sampling only): vLLM's 1 (weights "
            "kept on the host) or 2 (weights dropped: sync_weights must follow before generate)",
        ),
        Op("wake", (_ENGINE,), "dict", "brings a sleeping engine back"),
        Op("save_checkpoint", (_PATH,), "dict", "DeepSpeed checkpoint + arctic_rl.json under checkpoint_root"),
        Op("load_checkpoint", (_PATH,), "dict", "restores a checkpoint saved by save_checkpoint"),
        Op("health", (), "dict", "every engine worker's liveness, the step, the sleeping engines"),
        Op("reconnect_config", (), "str", "the deployment's config as JSON (its job_id; no token)"),
        Op("shutdown", (), "str", "stops the engines of the deployment (and an HTTP server)"),
    )
}


def lookup(name: str) -> Op:
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None:
        raise ProtocolError(f"unknown op {name!r:.60}; known: {sorted(OPS)}")
    return op

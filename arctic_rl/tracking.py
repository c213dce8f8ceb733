"""MLflow logging for arctic-rl runs, under the metric names verl uses.

Every run of a recipe (the arctic-rl reference loop, verl or SkyRL driving arctic-rl, native verl, native
SkyRL) logs to one MLflow experiment per recipe, tagged with `framework`, `backend`, `recipe`, `model`,
`nodes`, `gpus` (the reference loop: all of SETUP_TAGS); `arctic-rl compare` (arctic_rl/compare.py) reads
them back. Timing metrics use verl's names (`timing_s/<phase>`, from verl/trainer/ppo/metric_utils.py) so
that our runs and native verl runs line up without a mapping; SkyRL's names (`timing/<name>`) are mapped in
compare.py.

    from arctic_rl.tracking import Tracker, TIMING_GEN, TAG_FRAMEWORK, FRAMEWORK_ARCTIC
    tracker = Tracker.start("text2sql", run_name="grpo-smollm2", tags={TAG_FRAMEWORK: FRAMEWORK_ARCTIC},
                            params={"optimizer": {"lr": 1e-5}})
    tracker.log_metrics({TIMING_GEN: 12.5}, step=1)
    tracker.end()

Tracking URI: the `tracking_uri` argument, else env MLFLOW_TRACKING_URI, else a sqlite file
`runs/mlflow.db` under the current directory. Console echo is not this module's job.

Resuming: when env ARCTIC_RL_RESUME_KEY is set (jobs/bootstrap.py sets it to the job's folder, which is
stable across Slurm requeues), `Tracker.start` continues the unfinished run carrying the same key instead
of opening a second one, so a preempted-and-requeued job keeps one metric history.
"""

from __future__ import annotations

import importlib.abc
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

# Metric names shared with verl (values in seconds, per training step).
TIMING_GEN = "timing_s/gen"
TIMING_REWARD = "timing_s/reward"
TIMING_OLD_LOG_PROB = "timing_s/old_log_prob"
TIMING_REF = "timing_s/ref"
TIMING_ADV = "timing_s/adv"
TIMING_UPDATE_ACTOR = "timing_s/update_actor"
TIMING_UPDATE_WEIGHTS = "timing_s/update_weights"
TIMING_STEP = "timing_s/step"
TIMING_PREFIX = "timing_s/"
PERF_THROUGHPUT = "perf/throughput"  # tokens / s / GPU, as verl computes it
PERF_TOTAL_NUM_TOKENS = "perf/total_num_tokens"  # prompt + response tokens of the step, as verl logs it
REWARD_MEAN = "critic/rewards/mean"
RESPONSE_LENGTH_MEAN = "response_length/mean"
# The phases of one step, in execution order; `step` is the whole step (end to end).
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step")

# Standard tag keys and values.
TAG_FRAMEWORK = "framework"  # who drives the loop: arctic-rl (reference loop), verl, skyrl
TAG_BACKEND = "backend"  # who owns the compute: arctic-rl or native
TAG_RECIPE = "recipe"
TAG_MODEL = "model"
TAG_NODES = "nodes"
TAG_GPUS = "gpus"  # total GPUs of the run
# The rest of a run's setup: runs are only compared (arctic-rl compare) when all of SETUP_TAGS agree.
TAG_PROMPTS_PER_STEP = "prompts_per_step"
TAG_N = "n"  # responses per prompt
TAG_MAX_PROMPT_LENGTH = "max_prompt_length"  # tokens
TAG_MAX_RESPONSE_LENGTH = "max_response_length"  # tokens
TAG_SLURM_JOB_ID = "slurm_job_id"
TAG_RESUME_KEY = "arctic_rl.resume_key"
TAG_RESUMED_FROM_STEP = "resumed_from_step"  # the step of the checkpoint the latest attempt resumed from
STANDARD_TAGS = (TAG_FRAMEWORK, TAG_BACKEND, TAG_RECIPE, TAG_MODEL, TAG_NODES, TAG_GPUS)
SETUP_TAGS = (
    TAG_MODEL,
    TAG_NODES,
    TAG_GPUS,
    TAG_PROMPTS_PER_STEP,
    TAG_N,
    TAG_MAX_PROMPT_LENGTH,
    TAG_MAX_RESPONSE_LENGTH,
)
FRAMEWORK_ARCTIC = "arctic-rl"
FRAMEWORK_VERL = "verl"
FRAMEWORK_SKYRL = "skyrl"
FRAMEWORK_TRL = "trl"  # TRL's own GRPOTrainer (benchmarks/vs_trl.py)
BACKEND_ARCTIC = "arctic-rl"
BACKEND_NATIVE = "native"

# Tags filled from the environment when the caller does not give them: the job launcher (jobs/) knows
# the recipe, node and GPU counts and the Slurm job id; the loop need not pass them through.
ENV_DEFAULT_TAGS = {
    "ARCTIC_RL_RECIPE": TAG_RECIPE,
    "ARCTIC_RL_NODES": TAG_NODES,
    "ARCTIC_RL_GPUS": TAG_GPUS,
    "SLURM_JOB_ID": TAG_SLURM_JOB_ID,
}
ENV_RESUME_KEY = "ARCTIC_RL_RESUME_KEY"

# MLflow's limits (mlflow/utils/validation.py): values per log_batch call and param value length.
_MAX_PARAMS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAM_VALUE_CHARS = 6000


def set_run_context(
    framework: str, backend: str, recipe: str, model: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """For a framework whose own logger opens the MLflow run (verl, SkyRL): puts the standard tags into this
    process's MLFLOW_RUN_CONTEXT (a JSON dict of tags `mlflow.start_run` applies), with the ENV_DEFAULT_TAGS
    filled from the environment, plus `extra` (e.g. placement_tags of the deployment, so the run records where
    its engines ran, as the reference loop's does). Tags already in MLFLOW_RUN_CONTEXT win. Call it before the
    logger starts, in the process where it logs: the logger's params then pass the secret filter too
    (filter_secret_params)."""
    import json

    filter_secret_params()
    tags = {TAG_FRAMEWORK: framework, TAG_BACKEND: backend, TAG_RECIPE: recipe, TAG_MODEL: model}
    tags.update({tag: os.environ[env] for env, tag in ENV_DEFAULT_TAGS.items() if os.environ.get(env)})
    tags.update(extra or {})
    tags.update(json.loads(os.environ.get("MLFLOW_RUN_CONTEXT") or "{}"))
    os.environ["MLFLOW_RUN_CONTEXT"] = json.dumps(tags)
    return tags


def placement_tags(health: dict) -> dict[str, str]:
    """Where each engine runs, from the client's health(): `engine_hosts` (the distinct hosts) and
    `placement` (`training[0]=host,...`), so a multi-node run shows that its engines span the nodes."""
    hosts = {name: info.get("host", "?") for name, info in health.get("engines", {}).items()}
    return {
        "engine_hosts": ",".join(sorted(set(hosts.values()))),
        "placement": ",".join(f"{name}={host}" for name, host in sorted(hosts.items())),
    }


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI if set, else `sqlite:///<cwd>/runs/mlflow.db` (the folder is created)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    folder = Path.cwd().resolve() / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


# Keys never logged as params (at any depth): run configs may carry the backend's bearer token, and the frameworks'
# configs carry environment variables for their workers (verl's ray_kwargs.ray_init.runtime_env.env_vars), among
# them MLflow's own URI, which may hold a password (https://user:password@host), and its credentials.
SECRET_PARAM_KEYS = frozenset({"auth_token", "api_key", "access_token", "password", "secret", "token"})
SECRET_ENV_VARS = frozenset({"MLFLOW_TRACKING_URI"})  # dropped whole: a token may sit anywhere in it
# An environment variable's name (upper case) ending so: ARCTIC_RL_TOKEN, RAY_AUTH_TOKEN, MLFLOW_TRACKING_PASSWORD, ...
_SECRET_ENV_SUFFIX = re.compile(r"[A-Z0-9_]*_(TOKEN|PASSWORD|SECRET|API_KEY|ACCESS_KEY|SECRET_KEY|CREDENTIALS)")
_URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):[^/@\s]*@")


def is_secret_param(key: str) -> bool:
    """Whether a param key (flattened with `/` or `.`) names a secret: its last part is one of SECRET_PARAM_KEYS
    (any case), or an environment variable's name among SECRET_ENV_VARS or ending like one that holds a secret."""
    last = re.split(r"[/.]", str(key))[-1]
    return last.lower() in SECRET_PARAM_KEYS or last in SECRET_ENV_VARS or bool(_SECRET_ENV_SUFFIX.fullmatch(last))


def redact(value: str) -> str:
    """`value` with the password of any URL in it replaced (`https://alice:***@host`)."""
    return _URL_PASSWORD.sub(r"\g<scheme>\g<user>:***@", value)


def flatten_params(params: Mapping[str, Any], sep: str = "/") -> dict[str, str]:
    """Nested dicts become `a/b/c` keys (verl's convention); values become strings MLflow accepts.
    Secret keys (is_secret_param) are left out, passwords in URLs redacted."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        if is_secret_param(str(key)):
            continue
        if isinstance(value, Mapping):
            for sub_key, sub_value in flatten_params(value, sep).items():
                flat[f"{key}{sep}{sub_key}"] = sub_value
        else:
            flat[str(key)] = redact(str(value))[:_MAX_PARAM_VALUE_CHARS]
    return flat


_MLFLOW_CLIENT = "mlflow.tracking._tracking_service.client"  # every param MLflow logs passes its client's methods


def filter_secret_params() -> None:
    """Puts the secret filter (is_secret_param, redact) under every param this process logs to MLflow, whoever logs
    it: verl's and SkyRL's own loggers call `mlflow.log_params` with their whole config, flattened by themselves.
    MLflow's tracking client drops secret params and redacts URL passwords in the rest. Does not import MLflow (slow:
    tens of seconds on a loaded machine, and most processes of a run never log): the filter goes in when MLflow's
    client module is first imported. Idempotent."""
    module = sys.modules.get(_MLFLOW_CLIENT)
    if module is not None:
        _wrap_mlflow_client(module)
    elif not any(isinstance(f, _FilterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _FilterOnImport())


def _wrap_mlflow_client(module: Any) -> None:
    cls = module.TrackingServiceClient
    if getattr(cls, "_arctic_rl_secret_filter", False):
        return
    from mlflow.entities import Param

    log_param, log_batch = cls.log_param, cls.log_batch

    def filtered_log_param(self, run_id, key, value, *args, **kwargs):
        if is_secret_param(key):
            return value
        return log_param(self, run_id, key, redact(str(value)), *args, **kwargs)

    def filtered_log_batch(self, run_id, metrics=(), params=(), tags=(), *args, **kwargs):
        params = [Param(p.key, redact(str(p.value))) for p in params if not is_secret_param(p.key)]
        return log_batch(self, run_id, metrics, params, tags, *args, **kwargs)

    cls.log_param, cls.log_batch = filtered_log_param, filtered_log_batch
    cls._arctic_rl_secret_filter = True


class _FilterOnImport(importlib.abc.MetaPathFinder):
    """Wraps MLflow's tracking client as soon as its module has been executed (filter_secret_params)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MLFLOW_CLIENT:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                loader = spec.loader
                exec_module = loader.exec_module

                def exec_and_filter(module, exec_module=exec_module):
                    exec_module(module)
                    _wrap_mlflow_client(module)

                # this loader object serves this one module
                loader.exec_module = exec_and_filter  # type: ignore[method-assign]
                return spec
        return None


def _env_tags() -> dict[str, str]:
    return {tag: os.environ[env] for env, tag in ENV_DEFAULT_TAGS.items() if os.environ.get(env)}


class Tracker:
    """One MLflow run. Uses an explicit MlflowClient (no global active run) so several trackers, threads
    or a framework's own mlflow.start_run() in the same process do not interfere."""

    def __init__(self, client: Any, run_id: str, experiment_id: str) -> None:
        self._client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self._ended = False

    @classmethod
    def start(
        cls,
        experiment: str,
        *,
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
        params: dict | None = None,
        tracking_uri: str | None = None,
    ) -> Tracker:
        """Opens (or, under a job with ARCTIC_RL_RESUME_KEY, re-opens) a run in `experiment`."""
        if not experiment:
            raise ValueError(f"Tracker.start: experiment={experiment!r}; give the recipe name, e.g. 'text2sql'")
        from mlflow.tracking import MlflowClient  # mlflow is slow to import; keep `import arctic_rl` light

        filter_secret_params()  # also under any other logger of this process (a framework's own)
        client = MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        all_tags = {**_env_tags(), **{k: str(v) for k, v in (tags or {}).items()}}
        resume_key = os.environ.get(ENV_RESUME_KEY)
        run_id = cls._find_resumable(client, experiment_id, resume_key) if resume_key else None
        if run_id is None:
            if resume_key:
                all_tags[TAG_RESUME_KEY] = resume_key
            run_id = client.create_run(experiment_id, run_name=run_name, tags=all_tags).info.run_id
        else:
            client.update_run(run_id, status="RUNNING")
            cls._set_tags(client, run_id, all_tags)
        tracker = cls(client, run_id, experiment_id)
        if params:
            tracker.log_params(params)
        return tracker

    @staticmethod
    def _find_resumable(client: Any, experiment_id: str, resume_key: str) -> str | None:
        # A requeued job re-enters here; continue its run unless that run already finished.
        quoted = resume_key.replace("'", "\\'")
        runs = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_RESUME_KEY}` = '{quoted}'", max_results=5)
        for run in runs:
            if run.info.status != "FINISHED":
                return run.info.run_id
        return None

    @staticmethod
    def _set_tags(client: Any, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        if tags:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_params(self, params: dict) -> None:
        """Logs a (nested) dict of parameters; a key logged twice with a different value is an MLflow error,
        so a resumed run skips keys it already has."""
        from mlflow.entities import Param

        have = self._client.get_run(self.run_id).data.params
        flat = {k: v for k, v in flatten_params(params).items() if k not in have}
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=items[i : i + _MAX_PARAMS_PER_BATCH])

    def set_tags(self, tags: dict[str, str]) -> None:
        self._set_tags(self._client, self.run_id, {k: str(v) for k, v in tags.items()})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Logs one step's metrics (one batched call). Values must be numbers; the key names the bad one."""
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        items = []
        for key, value in metrics.items():
            try:
                items.append(Metric(key, float(value), timestamp_ms, int(step)))
            except (TypeError, ValueError) as err:
                raise ValueError(f"log_metrics: metric {key!r} has value {value!r}, expected a number") from err
        for i in range(0, len(items), _MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=items[i : i + _MAX_METRICS_PER_BATCH])

    def logged_steps(self, key: str) -> set[int]:
        """The steps at which `key` was logged in this run."""
        return {m.step for m in self._client.get_metric_history(self.run_id, key)}

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if not Path(path).exists():
            raise FileNotFoundError(f"log_artifact: path={str(path)!r} does not exist")
        self._client.log_artifact(self.run_id, str(path), artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        """Closes the run (FINISHED, FAILED or KILLED); a second call is a no-op."""
        if not self._ended:
            self._client.set_terminated(self.run_id, status=status)
            self._ended = True

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.end("FINISHED")
        elif issubclass(exc_type, KeyboardInterrupt | SystemExit):
            # Preemption (submitit exits through SystemExit) leaves the run open for the requeued job.
            self.end("KILLED")
        else:
            self.end("FAILED")


def save_figure(fig, path, dpi: int = 100):
    """Writes a matplotlib figure atomically (temp file + rename: no half-written PNG) and closes it."""
    import os
    from pathlib import Path

    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    fig.tight_layout()
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    tmp.replace(path)
    return path


ROLLING_WINDOW = 3  # steps in the reward curve's rolling mean: a step's reward swings with the prompts it drew


def rolling_mean(values: list[float], window: int = ROLLING_WINDOW) -> list[float]:
    """The trailing mean of up to `window` values ending at each position (the first ones average fewer)."""
    if window < 1:
        raise ValueError(f"rolling_mean: window={window!r}, expected an integer >= 1")
    return [sum(values[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window)) for i in range(len(values))]


def draw_reward_curve(
    ax,
    rewards: list[float],
    *,
    evals: Mapping[int, float] | None = None,
    label: str = "",
    color: str | None = None,
    window: int = ROLLING_WINDOW,
) -> dict[str, Any]:
    """Draws one run on `ax`: the per-step reward (critic/rewards/mean, step 1..N) as thin points, its rolling
    mean as a thick line, and the eval accuracy of `evals` ({step: accuracy}, the loop's eval_accuracy) as
    squares on the same axis; step -1 (before the SFT warm-up) is drawn hollow at step 0. Returns the artists
    by series ("reward", "rolling", "eval", "eval_before_sft"; absent when not drawn)."""
    prefix = f"{label}: " if label else ""
    steps = list(range(1, len(rewards) + 1))
    raw = ax.plot(steps, rewards, marker="o", ms=3, lw=0.8, alpha=0.45, color=color, label=f"{prefix}reward per step")[
        0
    ]
    color = raw.get_color()
    artists: dict[str, Any] = {"reward": raw}
    artists["rolling"] = ax.plot(
        steps, rolling_mean(rewards, window), lw=2.2, color=color, label=f"{prefix}rolling mean ({window} steps)"
    )[0]
    evals = dict(evals or {})
    after = sorted((s, a) for s, a in evals.items() if s >= 0)
    if after:
        artists["eval"] = ax.scatter(
            [s for s, _ in after],
            [a for _, a in after],
            marker="s",
            s=40,
            color=color,
            zorder=3,
            label=f"{prefix}eval accuracy",
        )
    if -1 in evals:
        artists["eval_before_sft"] = ax.scatter(
            [0],
            [evals[-1]],
            marker="s",
            s=40,
            facecolors="none",
            edgecolors=color,
            zorder=3,
            label=f"{prefix}eval accuracy before the SFT warm-up",
        )
    return artists


def plot_reward_runs(
    runs: Mapping[str, tuple[list[float], Mapping[int, float] | None]], path: Path, title: str = ""
) -> Path | None:
    """One PNG at `path` with every run's reward curve ({label: (rewards, evals)}) on one axis; None if no
    run has a reward."""
    if not any(rewards for rewards, _ in runs.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (rewards, evals) in runs.items():
        draw_reward_curve(ax, rewards, evals=evals, label=label if len(runs) > 1 else "")
    ax.set_xlabel("step")
    ax.set_ylabel(f"{REWARD_MEAN} / eval accuracy")
    ax.set_title(f"reward curve {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_rewards(
    rewards: list[float], path: Path, title: str = "", evals: Mapping[int, float] | None = None
) -> Path | None:
    """The loop's reward curve as a PNG at `path` (draw_reward_curve); None without rewards."""
    return plot_reward_runs({"": (rewards, evals)}, path, title)

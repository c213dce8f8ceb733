"""Weight sync: seconds per sync and the peak extra resident memory of every process involved (controller,
trainer, sampler: no reference is deployed, a sync never touches it), the bucketed streaming sync (`sync_weights`, vllm_config.sync_bucket_mb) vs the
whole-model path it replaced (the controller's `sync_weights_whole_model`, kept for this comparison), in the
same run, for the demo model (SmolLM2-135M) and synthetic float32 Llamas of 250M and 1B parameters.

    python benchmarks/weight_sync.py [--models demo,250m,1b] [--bucket-mb 256]

The whole-model path holds several copies of the model at once (the gathered state dict, its pickled bytes,
the object store's copy, the sampler's deserialized copy); it runs only where the machine has
WHOLE_MODEL_COPIES times the model's size available, and the report says when it was skipped.

Peak extra RSS of a process: "5" is written to /proc/<pid>/clear_refs before the sync (the kernel resets
VmHWM to the current RSS), VmHWM is read after it; extra = VmHWM - RSS before. It counts the object-store
pages a process touched, as the kernel does. The ratio is the largest process's extra over the model's size
in the sampler's dtype; the streaming sync's limit is 1/2 (issue 17). A benchmark, not a test: run it alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from report import Report, add_report_args

REPO = Path(__file__).resolve().parent.parent
# Synthetic models (a 512-token vocabulary): 1b is about 1.0e9 parameters (24 layers of 42M), 4 GB in float32;
# 250m about 2.5e8 (24 layers of 10.5M), 1 GB.
SYNTHETIC = {
    "1b": {"hidden": 2048, "layers": 24, "heads": 16, "kv_heads": 16},
    "250m": {"hidden": 1024, "layers": 24, "heads": 16, "kv_heads": 16},
}
WHOLE_MODEL_COPIES = 6


def synthetic_model(path: Path, size: str = "1b") -> Path:
    """A random float32 Llama saved as safetensors (tests/tiny_models.py builds it; no download)."""
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import make_tiny_model

    if (path / "config.json").exists():
        return path
    return make_tiny_model(path, "llama", **SYNTHETIC[size])


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) << 10
    return 0


def model_bytes(path: Path, itemsize: int = 4) -> int:
    """The model's size in the sampler's dtype (float32 here, whatever the checkpoint's): what one copy costs."""
    import math

    from safetensors import safe_open

    numel = 0
    for f in path.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            numel += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return numel * itemsize


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(f"/proc/{pid}/status has no {field}")


class PeakRSS:
    """Peak extra resident memory of processes over a span: reset each one's high-water mark, then read it."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.before: dict[str, int] = {}

    def __enter__(self) -> PeakRSS:
        for name, pid in self.pids.items():
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := current RSS
            self.before[name] = _status_kib(pid, "VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        self.extra = {name: (_status_kib(pid, "VmHWM") - self.before[name]) << 10 for name, pid in self.pids.items()}


def engine_pids(client) -> dict[str, int]:
    """The controller's and every engine worker's process id (all on this machine)."""
    import ray

    handle = client._t.handle
    pids = {"controller": ray.get(handle.__ray_call__.remote(lambda actor: os.getpid()))}
    for name, info in ray.get(handle.health.remote())["engines"].items():
        pids[name] = info["pid"]
    return pids


def deploy(model: Path, bucket_mb: int):
    from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client

    # float32, ZeRO stage 0: no optimizer state or flat fp32 copy is made before a step, so the 1B model
    # fits twice (trainer, sampler) in a small machine's memory. A sync does not involve the reference, so
    # none is deployed (loading a third copy would only cost time and memory).
    return create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            use_reference=False,
            training_config={"dtype": "float32", "zero_stage": 0, "micro_batch_size": 1},
            vllm_config={"max_seq_len": 256, "sync_bucket_mb": bucket_mb, "max_num_seqs": 4},
        )
    )


def measure(client, sync) -> tuple[float, dict[str, int], dict]:
    with PeakRSS(engine_pids(client)) as peak:
        t0 = time.perf_counter()
        out = sync()
        secs = time.perf_counter() - t0
    return secs, peak.extra, out


def bench_model(report: Report, label: str, model: Path, bucket_mb: int) -> None:
    import ray

    size = model_bytes(model)
    client = deploy(model, bucket_mb)
    try:
        handle = client._t.handle
        # The first sync after start-up also pays one-time costs (object-store pages a process touches for
        # the first time stay resident, vLLM sets up its reload), so it is a row of its own.
        runs = [
            ("streaming", f"{bucket_mb} MiB buckets, first sync", client.sync_weights),
            ("streaming", f"{bucket_mb} MiB buckets", client.sync_weights),
            ("whole model", "one state dict", lambda: ray.get(handle.sync_weights_whole_model.remote())),
        ]
        for path, detail, sync in runs:
            if path == "whole model" and available_bytes() < WHOLE_MODEL_COPIES * size:
                report.note(
                    f"{label}: the whole-model path was not run: it needs about {WHOLE_MODEL_COPIES} x the model "
                    f"({WHOLE_MODEL_COPIES * size / 2**30:.0f} GiB) free, {available_bytes() / 2**30:.0f} GiB was."
                )
                continue
            secs, extra, out = measure(client, sync)
            worst = max(extra, key=lambda k: extra[k])
            row = {
                "model": label,
                "model MiB": size / 2**20,
                "sync": path,
                "detail": detail,
                "sync s": secs,
                "buckets": out.get("buckets", 1),
            }
            row.update({f"{name} extra MiB": v / 2**20 for name, v in extra.items()})
            row["ratio (max extra / model)"] = extra[worst] / size
            row["limit"] = 0.5 if path == "streaming" else "-"
            report.add("Peak extra RSS per process during one sync", **row)
            print(row, flush=True)
    finally:
        client.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,250m,1b", help="comma-separated: demo, 250m, 1b")
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--model-dir", type=Path, default=None, help="where the synthetic model is built (a temp dir)")
    add_report_args(ap)
    a = ap.parse_args()
    report = Report.start("weight_sync", "Weight sync: streaming buckets vs the whole-model path", a)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from arctic_rl.demo_model import demo_model_path

    with tempfile.TemporaryDirectory(prefix="arctic-rl-sync-bench-") as tmp:
        for label in a.models.split(","):
            if label == "demo":
                bench_model(report, "SmolLM2-135M (demo)", demo_model_path(), a.bucket_mb)
            elif label in SYNTHETIC:
                model = synthetic_model((a.model_dir or Path(tmp)) / f"synthetic-{label}", label)
                bench_model(report, f"synthetic {label} (fp32)", model, a.bucket_mb)
            else:
                raise SystemExit(f"--models: unknown model {label!r} (demo, {', '.join(SYNTHETIC)})")
    report.note(
        "extra = VmHWM after the sync - VmRSS before it (VmHWM reset through /proc/<pid>/clear_refs); "
        "ratio = the largest process's extra / the model's size in float32 (the sampler's dtype here); "
        "limit: the streaming sync's bound (model size / 2). Each sync includes the exact weight check and "
        "the log-prob probe. The rows run in this order on one deployment per model."
    )
    report.write()


if __name__ == "__main__":
    main()

"""`arctic-rl export CKPT --out DIR`: a Hugging Face model folder (safetensors, config, tokenizer) from a
checkpoint of the backend, for transformers' from_pretrained, vLLM and the evals.

    arctic-rl export runs/text2sql/run/step_200 --out exports/text2sql-step200 [--dtype bfloat16]
    python -m evals.bird --model exports/text2sql-step200 --data DIR --predictions pred.json

CKPT is a folder written by the backend's save_checkpoint (the loop's <checkpoint.dir>/step_K): DeepSpeed's
checkpoint under the tag `arctic-rl`, then arctic_rl.json (step and the run's ArcticRLClientConfig), written
last. The weights are the trainer's fp32 master weights, gathered from every ZeRO partition by DeepSpeed's
own zero_to_fp32 merge (ZeRO-1/2/3; fp32 without ZeRO: the module weights DeepSpeed saved), cast to --dtype
(default: the run's training dtype). Every checkpoint file is read tensors-only (torch.load(weights_only=True),
arctic_rl/engines/safe_load.py), also the files zero_to_fp32 itself would unpickle: a file holding anything
else (a pickled object whose loading would run code) is refused, naming it. Config, tokenizer and generation
config come from the run's base model (model_name in arctic_rl.json, or --base), with the run's
model_overrides (e.g. YaRN rope scaling) set in the config, so that whoever loads the folder computes what the trainer computed. The folder is written under a
temporary name next to DIR and renamed into place: nothing half-written is left at DIR.

A LoRA run (training_config.lora) checkpoints its adapters only: the export loads the base model, puts the
adapters on it with the run's LoRA config and writes PEFT's merge (W + scale * B @ A) under the base model's
names, a plain model folder that needs no PEFT to load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from arctic_rl.engines.safe_load import load_tensors_only
from arctic_rl.errors import ConfigError

DS_TAG = "arctic-rl"  # the tag TrainingWorker.save_checkpoint saves under
META_FILE = "arctic_rl.json"
# The trainer's DeepSpeed module is LogProbModel, which holds the HF model as `.model`.
MODULE_PREFIX = "model."
DTYPES = ("float32", "bfloat16", "float16")


def read_meta(ckpt: Path) -> dict:
    meta_path = ckpt / META_FILE
    if not meta_path.is_file():
        raise ConfigError(
            f"CKPT={str(ckpt)!r} is not a complete arctic-rl checkpoint: {meta_path} does not exist "
            f"(save_checkpoint writes it last)"
        )
    meta = json.loads(meta_path.read_text())
    if not isinstance(meta.get("config"), dict) or "model_name" not in meta["config"]:
        raise ConfigError(f"{meta_path}: no config.model_name (not written by arctic-rl's save_checkpoint?)")
    return meta


def trained_state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    """The HF model's parameters as the trainer held them at save time (the fp32 masters under ZeRO)."""
    ds_dir = ckpt / DS_TAG
    if not ds_dir.is_dir():
        raise ConfigError(f"CKPT={str(ckpt)!r}: no DeepSpeed checkpoint folder {ds_dir}")
    if any(ds_dir.glob("*zero_pp_rank_*_optim_states.pt")):  # ZeRO-1/2/3, or bf16 without ZeRO
        state = zero_fp32_state(ds_dir)
    else:  # fp32 without ZeRO: no partitions to merge, the module as DeepSpeed saved it
        file = ds_dir / "mp_rank_00_model_states.pt"
        state = _field(load_tensors_only(file, map_location="cpu"), "module", file)
    foreign = [k for k in state if not k.startswith(MODULE_PREFIX)]
    if foreign:
        raise ConfigError(
            f"CKPT={str(ckpt)!r}: parameter names {foreign[:3]} are not under {MODULE_PREFIX!r} "
            f"(not a checkpoint of arctic-rl's trainer)"
        )
    return {k[len(MODULE_PREFIX) :]: v for k, v in state.items()}


def zero_fp32_state(ds_dir: Path) -> dict[str, torch.Tensor]:
    """DeepSpeed's zero_to_fp32 merge of the fp32 master partitions, with its file reading replaced: it
    unpickles with torch.load(weights_only=False); here every file is read tensors-only (safe_load)."""
    from deepspeed.checkpoint import constants as C
    from deepspeed.utils import zero_to_fp32 as z

    model_states = [_zero_model_state(Path(f)) for f in z.get_model_state_files(str(ds_dir))]
    files = [Path(f) for f in z.get_optim_files(str(ds_dir))]
    optim = [_field(load_tensors_only(f, map_location="cpu", mmap=True), C.OPTIMIZER_STATE_DICT, f) for f in files]
    stage = _field(optim[0], C.ZERO_STAGE, files[0])
    world = _field(optim[0], C.PARTITION_COUNT, files[0])
    world = max(world) if isinstance(world, list) else world
    if world != len(files):
        raise ConfigError(
            f"CKPT folder {ds_dir}: the optimizer was partitioned {world} ways but {len(files)} "
            "*_optim_states.pt files are there (a rank's save is missing)"
        )
    key = C.SINGLE_PARTITION_OF_FP32_GROUPS if stage <= 2 else C.FP32_FLAT_GROUPS
    groups = [_field(o, key, f) for o, f in zip(optim, files)]
    if stage <= 2:
        paddings = optim[0].get(C.PARAM_ALIGNMENT_PADDINGS)
        lazy = z._get_fp32_state_dict_from_zero2_checkpoint(world, groups, model_states, False, paddings)
    else:
        lazy = z._get_fp32_state_dict_from_zero3_checkpoint(world, groups, model_states, False)
    return z.to_torch_tensor(lazy)


def _zero_model_state(file: Path):
    """zero_to_fp32's record of one *_model_states.pt (buffers, parameter shapes, shared parameters)."""
    from deepspeed.checkpoint import constants as C
    from deepspeed.utils import zero_to_fp32 as z

    sd = load_tensors_only(file, map_location="cpu")
    names = set(_field(sd, C.BUFFER_NAMES, file))
    module = _field(sd, "module", file)
    return z.zero_model_state(
        buffers={k: v.float() if v.is_floating_point() else v for k, v in module.items() if k in names},
        param_shapes=_field(sd, C.PARAM_SHAPES, file),
        shared_params=[[k, v] for k, v in _field(sd, "shared_params", file).items()],
        ds_version=sd.get(C.DS_VERSION),
        frozen_param_shapes=sd.get(C.FROZEN_PARAM_SHAPES),
        frozen_param_fragments=sd.get(C.FROZEN_PARAM_FRAGMENTS),
    )


def _field(d: object, key: str, file: Path):
    if not isinstance(d, dict) or key not in d:
        raise ConfigError(f"{file}: no {key!r} in it (not a DeepSpeed checkpoint file of arctic-rl's trainer)")
    return d[key]


def merged_lora_state(base: str, overrides: dict, lora: dict, adapters: dict[str, torch.Tensor]) -> dict:
    """The base model's weights with the checkpoint's LoRA adapters merged in (PEFT's merge_and_unload)."""
    from transformers import AutoModelForCausalLM

    from arctic_rl.config import LoraConfig
    from arctic_rl.engines.lora import apply_lora

    model = AutoModelForCausalLM.from_pretrained(base, config=_hf_config(base, overrides), dtype=torch.float32)
    wrapped = apply_lora(model, LoraConfig(**lora))
    missing, unexpected = model.load_state_dict(adapters, strict=False)
    missing = [k for k in missing if ".lora_" in k]  # the base weights come from `base`
    if missing or unexpected:
        raise ConfigError(
            f"the checkpoint's adapters do not fit {base!r} with training_config.lora={lora}: "
            f"missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    return wrapped.merge_and_unload().state_dict()


def _hf_config(base: str, overrides: dict):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(base)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _write_folder(tmp: Path, base: str, overrides: dict, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = _hf_config(base, overrides)
    with torch.device("meta"):  # no random init of weights about to be replaced
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if model.config.tie_word_embeddings:
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ConfigError(
            f"the checkpoint's weights do not fit {base!r}: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    model.config.dtype = dtype
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
    try:
        GenerationConfig.from_pretrained(base).save_pretrained(tmp)
    except OSError:  # the base model has none: from_pretrained's defaults apply
        pass


def export(ckpt: str | Path, out: str | Path, *, dtype: str | None = None, base: str | None = None) -> Path:
    """Writes the HF folder `out` from checkpoint `ckpt`; returns its path."""
    ckpt, out = Path(ckpt).expanduser().resolve(), Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {str(out)!r} exists and is not empty; choose a new folder")
    meta = read_meta(ckpt)
    cfg = meta["config"]
    dtype = dtype or cfg.get("training_config", {}).get("dtype", "bfloat16")
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: expected one of {list(DTYPES)}")
    base = base or cfg["model_name"]
    if base.startswith((".", "/", "~")) and not Path(base).expanduser().exists():
        raise ConfigError(f"the run's base model {base!r} (config, tokenizer) is gone; give its folder with --base")
    state = trained_state_dict(ckpt)
    lora = (cfg.get("training_config") or {}).get("lora")
    if lora:
        state = merged_lora_state(base, cfg.get("model_overrides") or {}, lora, state)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        _write_folder(tmp, base, cfg.get("model_overrides") or {}, state, getattr(torch, dtype))
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="arctic-rl export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint folder of save_checkpoint (e.g. runs/x/step_10)")
    p.add_argument("--out", required=True, help="the Hugging Face folder to write (new or empty)")
    p.add_argument("--dtype", choices=DTYPES, help="weights dtype (default: the run's training dtype)")
    p.add_argument("--base", help="model folder or hub name for config and tokenizer (default: the run's model)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        out = export(args.checkpoint, args.out, dtype=args.dtype, base=args.base)
    except ConfigError as e:
        print(f"arctic-rl export: {e}", file=sys.stderr)
        return 2
    step = read_meta(Path(args.checkpoint).expanduser().resolve()).get("step")  # the backend's optimizer steps
    print(f"exported {args.checkpoint} (optimizer step {step}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

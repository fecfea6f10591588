"""Tiny random targets (llama, qwen3, nemotron_h) with a real byte-level tokenizer, saved as HF folders.

Tests use these instead of hub models: they load through the same code paths as real targets.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, NemotronHConfig, PreTrainedTokenizerFast, Qwen3Config

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|reserved_0|>"]


def tiny_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: ids 0-3 special, then the 256 bytes (vocab 260)."""
    byte_vocab = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(byte_vocab):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False), pre_tokenizers.Split("", "isolated")]
    )
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def tiny_config(model_type: str, vocab_size: int = 288, num_layers: int = 6, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=1,
    )
    if model_type == "llama":
        return LlamaConfig(num_hidden_layers=num_layers, tie_word_embeddings=True, **common)
    if model_type == "qwen3":
        return Qwen3Config(num_hidden_layers=num_layers, **common)
    if model_type == "nemotron_h":
        pattern = ["mamba", "moe", "attention", "mamba", "mlp", "attention"]
        return NemotronHConfig(
            layers_block_type=(pattern * num_layers)[:num_layers],
            # causal_conv1d's CUDA kernel needs the in-projection width (2 * heads * head_dim + 2 * groups *
            # state + heads = 328) to be a multiple of 8, as it is in the Nemotron-Nano shape (10,304)
            mamba_num_heads=8,
            mamba_head_dim=16,
            n_groups=2,
            ssm_state_size=16,
            chunk_size=8,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=32,
            **common,
        )
    raise ValueError(model_type)


def save_tiny_target(path: Path, model_type: str = "qwen3", seed: int = 0, **config_kwargs) -> Path:
    """A random-weight causal LM + tokenizer written as an HF folder at `path`."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **config_kwargs))
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def save_tiny_draft(path: Path, seed: int = 0, block_size: int = 16) -> Path:
    """A real DFlash draft folder (random weights, `seed` makes each one different) for a tiny target."""
    from flashdraft.model import DFlashDraftConfig, DFlashDraftModel

    config = DFlashDraftConfig(
        hidden_size=64, vocab_size=288, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, num_target_layers=6, max_position_embeddings=512,
        dflash_config={"mask_token_id": 3, "target_layer_ids": [1, 3], "block_size": block_size},
    )
    torch.manual_seed(seed)
    DFlashDraftModel(config).save_pretrained(path)
    return path


# A short multi-turn conversation with a system prompt, for chat-template and tokenising tests.
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi there"},
    {"role": "assistant", "content": "hello!"},
    {"role": "user", "content": "and?"},
    {"role": "assistant", "content": "bye"},
]

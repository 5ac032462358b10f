"""Random-weight Llama models of real shapes, for cost benchmarks (examples/scale/bench.py) and the CUDA-vs-CPU
`compress obr` ratio (scripts/obr_ratio.py): written one tensor at a time as bf16 safetensors shards from a fixed
seed, drawn on the CPU, so every machine gets the same bytes. Weights are N(0, 0.02), norms 1: quality means
nothing on them, cost does."""

from __future__ import annotations

import json
import time
from pathlib import Path

SHAPES = {
    # SmolLM2-135M / SmolLM2-360M (HuggingFaceTB) and TinyLlama-1.1B / Llama-2-7B configs
    "135M": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
                 rope_theta=100000.0, rms_norm_eps=1e-5),
    "360M": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                 num_key_value_heads=5, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
                 rope_theta=100000.0, rms_norm_eps=1e-5),
    "1.1B": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=2048,
                 rope_theta=10000.0, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=2000, tie_word_embeddings=True, max_position_embeddings=1024,
                 rope_theta=10000.0, rms_norm_eps=1e-5),  # smoke test only
    "7B": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=4096,
               rope_theta=10000.0, rms_norm_eps=1e-5),
}


def llama_config(shape: str, layers: int | None = None) -> dict:
    """config.json of a Llama of one of SHAPES (`layers` overrides the depth)."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
            "bos_token_id": 0, "eos_token_id": 0, "dtype": "bfloat16", **SHAPES[shape],
            **({"num_hidden_layers": layers} if layers else {})}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def write_random_model(path: Path, config: dict, seed: int, tokenizer=None) -> dict:
    """Random N(0, 0.02) weights (norms 1) in bf16, one tensor at a time into 1 GB shards, + config.json (+ the
    tokenizer); tensor i is drawn from seed·100003 + i. Returns {seconds, disk_mb, parameters}."""
    import torch

    from toolkit.models.memory import skeleton
    from toolkit.models.shards import ShardWriter

    started = time.perf_counter()
    Path(path).mkdir(parents=True, exist_ok=True)
    model = skeleton(config)
    tied = config.get("tie_word_embeddings", False)
    params = [(n, p) for n, p in model.named_parameters() if not (tied and n == "lm_head.weight")]
    writer = ShardWriter(path, [(n, torch.bfloat16, tuple(p.shape)) for n, p in params], max_shard_bytes=10**9)
    for position, (name, param) in enumerate(params):
        generator = torch.Generator().manual_seed(seed * 100_003 + position)
        if name.endswith("norm.weight"):
            value = torch.ones(param.shape)
        else:
            value = torch.empty(param.shape).normal_(0.0, 0.02, generator=generator)
        writer.add({name: value.to(torch.bfloat16)})
        del value
    writer.close()
    (Path(path) / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return {"seconds": round(time.perf_counter() - started, 1), "disk_mb": round(dir_bytes(path) / 2**20, 1),
            "parameters": sum(p.numel() for _, p in params)}

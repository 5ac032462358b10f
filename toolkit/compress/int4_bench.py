"""Benchmarks for the INT4 kernels: GEMM timings against torch FP32 matmul, and end-to-end decoding of a packed
model against its FP32 (dequantised) twin. Kernels are timed interleaved in one loop, best of N, so a loaded
machine slows every contestant alike; ratios are the honest figure, absolute times are noisy."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from toolkit.compress.config import BenchConfig  # noqa: F401 - its config, declared torch-free
from toolkit.core.errors import BadInputError
from toolkit.ops.int4 import pack_24, pack_dense
from toolkit.ops.packed_linear import PackedInt4Linear


def best_of_interleaved(contestants: dict, repeats: int, warmup: int = 2) -> dict[str, float]:
    """{name: best wall-clock ms}; each repeat runs every contestant once, in turn."""
    for _ in range(warmup):
        for fn in contestants.values():
            fn()
    best = {name: float("inf") for name in contestants}
    for _ in range(repeats):
        for name, fn in contestants.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
    return best


def random_24_codes(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    codes = torch.randint(-8, 8, (n, k // 4, 4), generator=generator, dtype=torch.int16)
    drop = torch.rand(codes.shape, generator=generator).argsort(-1)[..., :2]
    return codes.scatter_(-1, drop, 0).reshape(n, k)


def gemm_rows(n: int, k: int, ms: tuple[int, ...], repeats: int, seed: int = 0) -> list[dict]:
    """Dense INT4 and 2:4 INT4 (W4A8, activation quantisation included) against torch FP32 linear at each m;
    one row per INT4 kernel, the FP32 time in `fp32_ms`."""
    g = torch.Generator().manual_seed(seed)
    codes = random_24_codes(n, k, g)
    scales = torch.rand(n, generator=g) * 0.01 + 0.001
    weight = codes.float() * scales[:, None]
    dense = PackedInt4Linear(pack_dense(codes, scales))
    sparse = PackedInt4Linear(pack_24(codes, scales))
    rows = []
    for m in ms:
        x = torch.randn(m, k, generator=g)
        with torch.inference_mode():
            best = best_of_interleaved({"fp32": lambda x=x: torch.nn.functional.linear(x, weight),
                                        "int4_dense": lambda x=x: dense(x), "int4_sparse24": lambda x=x: sparse(x)},
                                       repeats)
        for kernel in ("int4_dense", "int4_sparse24"):
            rows.append({"kernel": kernel, "m": m, "n": n, "k": k, "ms": round(best[kernel], 4),
                         "speedup_vs_fp32": round(best["fp32"] / best[kernel], 3), "fp32_ms": round(best["fp32"], 4),
                         "speedup_vs_dense": round(best["int4_dense"] / best[kernel], 3)})
    return rows


def model_megabytes(model) -> float:
    """Bytes held by parameters and buffers (tied tensors once) plus PackedInt4Linear weights."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    total += sum(m.weights.nbytes() for m in model.modules() if isinstance(m, PackedInt4Linear))
    return total / 1e6


def linear_megabytes(packed_dir: str | Path) -> dict[str, float]:
    """The quantized linears alone: FP32 size from their shapes vs their packed tensors (codes, scales, mask);
    embeddings, lm_head and norms are what the packed format keeps in float16."""
    from toolkit.compress.packed import read_packed

    config, tensors = read_packed(packed_dir)
    fp32 = sum(4 * rows * columns for rows, columns in config["linears"].values())
    packed = sum(tensors[f"{path}.{key}"].nbytes for path in config["linears"] for key in ("qweight", "scales", "mask")
                 if f"{path}.{key}" in tensors)
    return {"fp32_linear_mb": round(fp32 / 1e6, 3), "packed_linear_mb": round(packed / 1e6, 3)}


def decode_tokens_per_s(model, prompt_ids: torch.Tensor, new_tokens: int) -> float:
    """Greedy decoding with the KV cache, timed after the prefill."""
    with torch.inference_mode():
        out = model(prompt_ids, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(new_tokens):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return new_tokens / (time.perf_counter() - start)


def prefill_ms(model, prompt_ids: torch.Tensor) -> float:
    with torch.inference_mode():
        start = time.perf_counter()
        model(prompt_ids, use_cache=False)
        return (time.perf_counter() - start) * 1e3


def model_comparison(packed_dir: str | Path, prompt_len: int, new_tokens: int, repeats: int, a_bits: int = 8,
                     seed: int = 0) -> dict:
    """Packed model on the INT4 kernels vs the same weights dequantised to FP32: memory, prefill, decode, logits."""
    from toolkit.compress.packed import WEIGHTS, load_packed
    from toolkit.compress.packed_int4 import load_packed_int4

    fp32, _ = load_packed(packed_dir, dtype=torch.float32, with_tokenizer=False)
    packed, _ = load_packed_int4(packed_dir, a_bits=a_bits, with_tokenizer=False)
    vocab = fp32.config.vocab_size
    ids = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        logits_gap = float((fp32(ids).logits - packed(ids).logits).abs().max())
    decode = {"fp32": [], "packed": []}
    prefill = {"fp32": [], "packed": []}
    for _ in range(repeats):
        for name, model in (("fp32", fp32), ("packed", packed)):
            decode[name].append(decode_tokens_per_s(model, ids, new_tokens))
            prefill[name].append(prefill_ms(model, ids))
    sparse = sum(m.weights.sparse for m in packed.modules() if isinstance(m, PackedInt4Linear))
    linear_mb = linear_megabytes(packed_dir)
    return {"fp32_mb": round(model_megabytes(fp32), 2),
            "packed_mb": round((Path(packed_dir) / WEIGHTS).stat().st_size / 1e6, 2),
            "packed_in_memory_mb": round(model_megabytes(packed), 2),
            **linear_mb,
            "decode_tokens_per_s_fp32": round(max(decode["fp32"]), 2),
            "decode_tokens_per_s_packed": round(max(decode["packed"]), 2),
            "prefill_ms_fp32": round(min(prefill["fp32"]), 2), "prefill_ms_packed": round(min(prefill["packed"]), 2),
            "max_abs_logit_gap_vs_fp32": round(logits_gap, 5), "prompt_tokens": prompt_len,
            "new_tokens": new_tokens, "a_bits": a_bits,
            "linears_24": sparse,
            "linears": sum(isinstance(m, PackedInt4Linear) for m in packed.modules())}


def packed_directory(spec: str) -> Path:
    from toolkit.compress.packed import WEIGHTS

    root = Path(spec)
    for candidate in (root, root / "packed"):
        if (candidate / WEIGHTS).is_file():
            return candidate
    raise BadInputError(f"{spec} is not a packed iclrkit model (no {WEIGHTS}, nor packed/{WEIGHTS})")


def run_bench(config: BenchConfig, ctx) -> dict:
    from toolkit.ops import has_op

    directory = packed_directory(config.model) if config.model else None
    rows = gemm_rows(config.n, config.k, tuple(config.rows), config.repeats, ctx.seed)
    result = {"rows": rows, "compiled_kernels": has_op("int4_gemm")}
    if directory is not None:
        ctx.inputs["model"] = str(directory)
        result["model"] = model_comparison(directory, config.prompt_tokens, config.new_tokens,
                                           config.model_repeats, config.a_bits, ctx.seed)
    ctx.path("results.json").write_text(json.dumps(result, indent=2))
    for row in rows:
        ctx.metrics[f"{row['kernel']}_m{row['m']}_speedup_vs_fp32"] = row["speedup_vs_fp32"]
    ctx.metrics.update({f"model_{k}": v for k, v in result.get("model", {}).items()})
    return result

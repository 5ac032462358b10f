"""The 7B-70B plan for OBR on GPUs (issue 42): FLOPs and memory per block for OBR and GPTQ at the Llama-2-7B,
Llama-3-70B and Qwen3-235B-A22B (MoE) shapes, and the H200 time they imply — a PROJECTION from operation counts,
the CG iteration counts measured on this CPU (examples/scale/results.json, "solver_study") and the H200's peak
rates, not a measurement. `make gpu-check` (scripts/obr_block_check.py) measures one 7B-shaped block on the first
GPU lent, to check it.

    python examples/scale/gpu_plan.py            # -> results.json "gpu_plan", RESULTS.md re-rendered

Operation counts, per linear with r output rows, C input columns, n calibration tokens, deflation rank k and
(n1, n2) CG iterations of the two OBR solves (what toolkit/compress/{obr,solvers}.py and toolkit/linalg run):
  Hessian        n·C²                (one per sequential group: q/k/v share theirs, gate/up theirs)
  damped Cholesky C³/3; H⁻¹ (cholesky_inverse) 2C³/3; chol(H⁻¹) C³/3      (GPTQ and OBR alike)
  GPTQ loop      r·C² (lazy-batch error propagation) + C column steps (each ~8 small kernels on a GPU)
  OBR solve 1    rhs 2rC² + n1·(2rC² + 4rCk) + set-up rC·k²/2 + r·k³      (columns C, rank k = auto_rank(C))
  OBR solve 2    rhs rC² + n2·(2r(C/2)² + 4r(C/2)k₂) + set-up r(C/2)·k₂²/2 + r·k₂³
  OBR GPTQ half  r·C²/4 + C/2 column steps
Memory per linear (float32): the Hessian work (accumulator, damped H, its factor, H⁻¹, chol(H⁻¹): 5·C²), the weight
copies (6·r·C) and the CG work arrays of one row chunk (12·rows·C, chunks of cg_bytes = 256 MiB) + the Woodbury
cores (rows·k²). MoE: every expert is a linear with its own Hessian over the ~n·top_k/experts tokens routed to it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# H200 SXM (NVIDIA's data sheet, dense): FP32 67 TFLOPS (CUDA cores; torch's default, TF32 off, runs the solves at
# this rate), BF16 tensor 989 TFLOPS (the calibration forward), HBM3e 4.8 TB/s, 141 GB.
H200 = {"fp32_tflops": 67.0, "bf16_tflops": 989.0, "hbm_tb_s": 4.8, "memory_gb": 141}
# assumed efficiencies (stated, not measured): GEMM-shaped work 60 % of peak, Cholesky/inverse 30 %, the forward
# 40 % of the BF16 peak; one GPTQ column step ~8 kernel launches of ~6 µs
EFFICIENCY = {"gemm": 0.6, "factor": 0.3, "forward": 0.4}
COLUMN_STEP_S = 8 * 6e-6
TOKENS = 128 * 2048  # the paper's calibration: 128 windows of 2048 tokens
CG_BYTES = 256 * 2**20

SHAPES = {
    "Llama-2-7B": {"hidden": 4096, "intermediate": 11008, "heads": 32, "kv_heads": 32, "head_dim": 128,
                   "blocks": 32},
    "Llama-3-70B": {"hidden": 8192, "intermediate": 28672, "heads": 64, "kv_heads": 8, "head_dim": 128,
                    "blocks": 80},
    "Qwen3-235B-A22B": {"hidden": 4096, "intermediate": 1536, "heads": 64, "kv_heads": 4, "head_dim": 128,
                        "blocks": 94, "experts": 128, "top_k": 8},
}


def auto_rank(columns: int) -> int:
    from toolkit.linalg.restricted import auto_rank as rank

    return rank(columns)


def linears(shape: dict, tokens: int) -> list[dict]:
    """The block's linears as (name, rows, columns, tokens seen, group) — one entry per distinct linear."""
    h, i = shape["hidden"], shape["intermediate"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    out = [dict(name="q_proj", rows=q, columns=h, tokens=tokens, group="qkv"),
           dict(name="k_proj", rows=kv, columns=h, tokens=tokens, group="qkv"),
           dict(name="v_proj", rows=kv, columns=h, tokens=tokens, group="qkv"),
           dict(name="o_proj", rows=h, columns=q, tokens=tokens, group="o")]
    experts = shape.get("experts", 1)
    routed = tokens * shape.get("top_k", 1) // experts
    for e in range(experts):
        tag = f"e{e}." if experts > 1 else ""
        out += [dict(name=f"{tag}gate_proj", rows=i, columns=h, tokens=routed, group=f"{tag}mlp"),
                dict(name=f"{tag}up_proj", rows=i, columns=h, tokens=routed, group=f"{tag}mlp"),
                dict(name=f"{tag}down_proj", rows=h, columns=i, tokens=routed, group=f"{tag}down")]
    return out


def costs(linear: dict, n1: float, n2: float) -> dict:
    r, C = linear["rows"], linear["columns"]
    k, half = auto_rank(C), C // 2
    k2 = auto_rank(half)
    factor = C ** 3 / 3 + 2 * C ** 3 / 3 + C ** 3 / 3  # damped Cholesky, H⁻¹, chol(H⁻¹)
    gptq_gemm = r * C * C
    solve1 = 2 * r * C * C + n1 * (2 * r * C * C + 4 * r * C * k) + r * C * k * k / 2 + r * k ** 3
    solve2 = r * C * C + n2 * (2 * r * half * half + 4 * r * half * k2) + r * half * k2 * k2 / 2 + r * k2 ** 3
    chunk = min(r, max(256, CG_BYTES // (12 * C * 4)))
    return {"factor_flops": factor, "gptq_gemm_flops": gptq_gemm,
            "obr_gemm_flops": solve1 + solve2 + gptq_gemm / 4, "obr_steps": C - C // 2,
            "hessian_work_bytes": 5 * C * C * 4, "weight_bytes": 6 * r * C * 4,
            "cg_bytes": 12 * chunk * C * 4 + chunk * k * k * 4}


def plan(iterations: tuple[float, float], tokens: int = TOKENS) -> list[dict]:
    return [project(name, shape, iterations, tokens) for name, shape in SHAPES.items()]


def shape_of_config(config: dict) -> dict:
    """The plan's shape dict of a Llama config.json (toolkit.models.synthetic.llama_config)."""
    heads = config["num_attention_heads"]
    return {"hidden": config["hidden_size"], "intermediate": config["intermediate_size"], "heads": heads,
            "kv_heads": config.get("num_key_value_heads", heads),
            "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
            "blocks": config["num_hidden_layers"]}


def project(name: str, shape: dict, iterations: tuple[float, float], tokens: int = TOKENS) -> dict:
    """One shape's projected FLOPs, memory and H200 seconds per block (see the module docstring)."""
    n1, n2 = iterations
    rate = H200["fp32_tflops"] * 1e12
    block = linears(shape, tokens)
    groups: dict[str, list[dict]] = {}
    for linear in block:
        groups.setdefault(linear["group"], []).append(linear)
    hessian = sum(g[0]["tokens"] * g[0]["columns"] ** 2 for g in groups.values())
    parts = [costs(linear, n1, n2) for linear in block]
    # GPTQ stacks the rows of a group (one factorization per group: recipe._solve_group); OBR factors per linear
    gptq_factor = sum(costs(g[0], n1, n2)["factor_flops"] for g in groups.values())
    obr_factor = sum(p["factor_flops"] for p in parts)
    gptq_gemm = hessian + sum(p["gptq_gemm_flops"] for p in parts)
    obr_gemm = hessian + sum(p["obr_gemm_flops"] for p in parts)
    gptq_steps = sum(g[0]["columns"] for g in groups.values())
    obr_steps = sum(p["obr_steps"] for p in parts)
    gptq_s = gptq_gemm / (rate * EFFICIENCY["gemm"]) + gptq_factor / (rate * EFFICIENCY["factor"]) \
        + gptq_steps * COLUMN_STEP_S
    obr_s = obr_gemm / (rate * EFFICIENCY["gemm"]) + obr_factor / (rate * EFFICIENCY["factor"]) \
        + obr_steps * COLUMN_STEP_S
    h, i = shape["hidden"], shape["intermediate"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    active = h * (q + 2 * kv) + q * h + shape.get("top_k", 1) * 3 * h * i  # per-token weights of the forward
    forward_s = 2 * active * tokens / (H200["bf16_tflops"] * 1e12 * EFFICIENCY["forward"])
    params = sum(linear["rows"] * linear["columns"] for linear in block)
    largest = max(parts, key=lambda p: p["hessian_work_bytes"] + p["weight_bytes"] + p["cg_bytes"])
    widest = max(block, key=lambda linear: linear["rows"] * linear["columns"] ** 2)
    return {
        "shape": name, "blocks": shape["blocks"], "linears_per_block": len(block),
        "block_params_m": round(params / 1e6, 1), "tokens": tokens, "iterations": [n1, n2],
        "gptq_tflop_per_block": _round((gptq_gemm + gptq_factor) / 1e12),
        "obr_tflop_per_block": _round((obr_gemm + obr_factor) / 1e12),
        "forward_s_per_block": _round(forward_s),
        "gptq_s_per_block": _round(gptq_s + forward_s), "obr_s_per_block": _round(obr_s + forward_s),
        "obr_over_gptq": round((obr_s + forward_s) / (gptq_s + forward_s), 2),
        "gptq_h_model": round((gptq_s + forward_s) * shape["blocks"] / 3600, 2),
        "obr_h_model": round((obr_s + forward_s) * shape["blocks"] / 3600, 2),
        "obr_solve_peak_gb": round((largest["hessian_work_bytes"] + largest["weight_bytes"] + largest["cg_bytes"])
                                   / 2**30, 2),
        "gptq_solve_peak_gb": round((largest["hessian_work_bytes"] + largest["weight_bytes"] * 5 / 6) / 2**30, 2),
        # what the exact batched Cholesky would hold for the widest linear: every row's H_RR (C/2 square)
        "cholesky_all_rows_gb": round(widest["rows"] * (widest["columns"] / 2) ** 2 * 4 / 2**30, 1),
    }


def _round(seconds: float) -> float:
    """Three significant digits (a tiny smoke shape projects microseconds)."""
    return float(f"{seconds:.3g}")


def measured_iterations(data: dict) -> tuple[float, float]:
    """The most iterations the default CG solver took on any measured layer, per solve (conservative)."""
    rows = [r for r in data.get("solver_study", {}).get("rows", []) if r.get("default") and "iterations" in r]
    if not rows:
        raise SystemExit("no solver_study rows in results.json: run examples/scale/solvers_study.py first")
    return (max(r["iterations"][0] for r in rows), max(r["iterations"][1] for r in rows))


def main() -> None:
    import bench

    path = HERE / "results.json"
    data = json.loads(path.read_text())
    iterations = measured_iterations(data)
    data["gpu_plan"] = {"rows": plan(iterations), "h200": H200, "efficiency": EFFICIENCY,
                        "column_step_s": COLUMN_STEP_S, "iterations_from": "max over the solver_study rows of the "
                        "default solver (CPU, 8 x 512 or 16 x 256 calibration tokens)"}
    path.write_text(json.dumps(data, indent=2))
    bench.write_markdown(data)
    for row in data["gpu_plan"]["rows"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()

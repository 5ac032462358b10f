"""OBR restoration solvers compared on the same layers (issue 42): every candidate against the exact batched
Cholesky solution, on problems captured from real runs (examples/scale/capture.py).

    python examples/scale/solvers_study.py --problems runs/obr-problems/smollm2 --label SmolLM2-135M [--rows N]
        [--candidates a,b,...] [--blocks 1] [--threads 1]

Per linear and candidate: CPU seconds of the restoration (both solves: pruning compensation, then the quantization
compensation), CG iterations per solve, seconds in the products with H vs the preconditioner vs set-up vs the rest,
the relative residual reached, and two losses against the float64 Cholesky solution of the same problem:
  - restoration: the pruning solve's objective, Σ_rows δᵀHδ with δ_E = −w_E (relative excess over the optimum);
  - final: the layer loss tr((W − Ŵ) H (W − Ŵ)ᵀ) after OBR_GPTQ (the damped H the solvers minimise), relative
    difference against OBR_GPTQ on the exact restoration (can be either sign: rounding decides).
`--rows N` takes the first N output rows of each linear (the exact reference costs one Cholesky of ~C/2 per row).
Rows go to examples/scale/results.json under "solver_study"; RESULTS.md is rewritten (bench.write_markdown).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# name: (solver, options for solvers.restricted_solve); DEFAULT is what `compress obr` runs
CANDIDATES = {
    "cholesky": ("cholesky", {"obs": False}),
    "cholesky-obs": ("cholesky", {"obs": True}),
    "jacobi-r1e-4": ("cg-jacobi", {"stop": "residual", "tol": 1e-4}),  # the solver before issue 42
    "jacobi-l1e-3": ("cg-jacobi", {"tol": 1e-3}),
    "inverse-l1e-3": ("cg-inverse", {"tol": 1e-3}),
    "block64-l1e-3": ("cg-block", {"tol": 1e-3, "block": 64}),
    "deflation32-l1e-3": ("cg", {"tol": 1e-3, "rank": 32}),
    "deflation64-l1e-3": ("cg", {"tol": 1e-3, "rank": 64}),
    "deflation128-l1e-3": ("cg", {"tol": 1e-3, "rank": 128}),
    "deflationauto-l1e-3": ("cg", {"tol": 1e-3}),
    "deflationauto-l3e-3": ("cg", {"tol": 3e-3}),
    "deflationauto-l1e-2": ("cg", {"tol": 1e-2}),
    "deflationauto-l1e-4": ("cg", {"tol": 1e-4}),
    "deflationauto-r1e-4": ("cg", {"stop": "residual", "tol": 1e-4}),
    "deflationauto-bf16setup-l1e-3": ("cg", {"tol": 1e-3, "low_precision_setup": True}),
    "deflationauto-bf16-l1e-3": ("cg", {"tol": 1e-3, "product": "bf16"}),
    "deflationauto-bf16x3-l1e-3": ("cg", {"tol": 1e-3, "product": "bf16x3"}),
    "deflationauto-bf16-refresh8-l1e-3": ("cg", {"tol": 1e-3, "product": "bf16", "refresh": 8}),
}
DEFAULT = "deflationauto-l1e-3"
CANDIDATE_NOTES = {
    "cholesky": "exact: one batched Cholesky of each row's H_RR (float32, padded chunks) — the reference speed",
    "cholesky-obs": "exact, the OBS identity δ_R = −G_RE (G_EE)⁻¹ w_E (G = H⁻¹): factors |E| instead of |R|; the "
                    "default picks it when |E| < |R| (sparsity < 50 %); at 50 % both sides are equal",
    "jacobi-r1e-4": "CG, Jacobi preconditioner, ‖r‖ ≤ 1e-4·‖rhs‖ per row: the solver before issue 42",
    "jacobi-l1e-3": "the same CG stopped on the layer loss (1e-3): the tolerance change alone",
    "inverse-l1e-3": "CG preconditioned by the restriction of the damped H⁻¹ (GPTQ's, already factored): two "
                     "products per iteration",
    "block64-l1e-3": "CG preconditioned by each row's exact 64-column diagonal blocks of H_RR (block-Jacobi; an "
                     "incomplete Cholesky of a dense H_RR is its full Cholesky, so none is listed)",
    "deflation32-l1e-3": "CG preconditioned by the deflation model (top-32 eigenpairs of D^-½HD^-½ + μI, "
                         "Woodbury per row)",
    "deflation64-l1e-3": "the same, rank 64",
    "deflation128-l1e-3": "the same, rank 128",
    "deflationauto-l1e-3": "the default: rank C/16 in [16, 64], stopped when the layer loss's decrease over 3 steps "
                           "is ≤ 1e-3 of it",
    "deflationauto-l3e-3": "the default at tolerance 3e-3",
    "deflationauto-l1e-2": "the default at tolerance 1e-2",
    "deflationauto-l1e-4": "the default at tolerance 1e-4",
    "deflationauto-r1e-4": "the default preconditioner with the old residual stop (1e-4)",
    "deflationauto-bf16setup-l1e-3": "mixed precision: the Woodbury Gram products in bfloat16 (AMX): the "
                                     "preconditioner loses definiteness (rejected)",
    "deflationauto-bf16-l1e-3": "mixed precision: CG's products with H in bfloat16 (6x faster on AMX): diverges "
                                "on ill-conditioned layers (rejected)",
    "deflationauto-bf16x3-l1e-3": "products as three bfloat16 GEMMs (hi/lo split; CPU bf16 GEMMs round their "
                                  "outputs to bf16): still diverges on SmolLM2's o_proj (rejected)",
    "deflationauto-bf16-refresh8-l1e-3": "bfloat16 products with the residual recomputed in float32 every 8 steps "
                                         "(rejected: same failures)",
    "warm start": "not a separate run: the quantization solve's unknown is a correction to the restored weights, "
                  "so starting it at zero is starting from the pruning solve's solution; re-solving R2 from the "
                  "restored weights has the same residual, hence the same iterates",
}


def layer_loss(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> float:
    D = (W - Q).double()
    return float(((D @ H.double()) * D).sum())


def run(name: str, problem: dict, W: torch.Tensor, keep: torch.Tensor, scale, hessian, quantize: bool):
    """(output, the per-solve SolveStats, CPU seconds): OBR_GPTQ (quantize) or the pruning restoration alone."""
    from toolkit.compress.obr import obr_quantize, obr_restore

    solver, options = CANDIDATES[name]
    options = dict(options)
    tol, rank = options.pop("tol", None), options.pop("rank", None)
    stats: list = []
    started = time.process_time()
    if quantize:
        out = obr_quantize(W, hessian, keep, scale, problem["bits"], problem["alpha"], "gptq", problem["blocksize"],
                           solver, tol=tol, rank=rank, options=options, stats=stats)
    else:
        out = obr_restore(W, hessian, keep, None, 16, problem["alpha"], solver, tol=tol, rank=rank, options=options,
                          stats=stats)
    return out, stats, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--rows", type=int, default=0, help="first N output rows of each linear (0: all)")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--blocks", default="", help="comma-separated block indices to use (default: all captured)")
    parser.add_argument("--linears", default="", help="comma-separated linear positions (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from toolkit.compress.solvers import DampedHessian, gptq
    from toolkit.core.errors import RunError
    from toolkit.linalg.restricted import SolveStats

    files = sorted(Path(args.problems).glob("b*-l*.pt"))
    if args.blocks:
        files = [f for f in files if int(f.name[1:3]) in {int(b) for b in args.blocks.split(",")}]
    if args.linears:
        files = [f for f in files if int(f.name.split("-")[1][1:]) in {int(b) for b in args.linears.split(",")}]
    results = []
    for path in files:
        problem = torch.load(path, weights_only=False)
        rows = min(args.rows or problem["W"].shape[0], problem["W"].shape[0])
        H = problem["H"]

        def hessian(dtype=H.dtype):
            Hd = H.to(dtype)
            return DampedHessian(H=Hd, L=torch.linalg.cholesky(Hd), damp=problem["damp"], dead=problem["dead"])

        W = problem["W"][:rows].to(H.dtype).clone()
        W[:, problem["dead"]] = 0
        keep = problem["keep"][:rows]
        scale = problem["scale"][:rows] if problem["scale"] is not None else None
        unique_masks = len({row.numpy().tobytes() for row in keep})
        # the exact reference: float64 Cholesky restoration, then the same OBR_GPTQ
        exact64 = hessian(torch.float64)
        restored_exact, _, _ = run("cholesky", problem, W.double(), keep, None, exact64, False)
        loss1_exact = layer_loss(W, restored_exact, H)
        final_exact, _, _ = run("cholesky", problem, W.double(), keep, scale, exact64, True)
        final_loss_exact = layer_loss(W, final_exact, H)
        started = time.process_time()
        gptq(W, hessian(), scale, problem["bits"], mask=keep, blocksize=problem["blocksize"])
        gptq_seconds = time.process_time() - started
        print(f"{path.name}: rows {rows}, unique row masks {unique_masks}, GPTQ {gptq_seconds:.2f} CPU s",
              flush=True)
        for name in args.candidates.split(","):
            shared = hessian()
            shared.inverse()  # H⁻¹ is GPTQ's anyway (OBR_GPTQ computes it once): not charged to the restoration
            try:
                out, stats, seconds = run(name, problem, W, keep, scale, shared, True)
            except RunError as error:
                print(f"  {name:28s} failed: {error}", flush=True)
                results.append({"set": args.label, "linear": path.stem, "rows": rows, "columns": W.shape[1],
                                "candidate": name, "failed": str(error), "threads": args.threads})
                continue
            first, second = (stats + [SolveStats(), SolveStats()])[:2]
            restoration = first.seconds + second.seconds
            restored, _, _ = run(name, problem, W, keep, None, shared, False)
            row = {"set": args.label, "linear": path.stem, "rows": rows, "columns": W.shape[1], "candidate": name,
                   "default": name == DEFAULT, "restoration_cpu_s": round(restoration, 4),
                   "obr_layer_cpu_s": round(seconds, 4), "gptq_layer_cpu_s": round(gptq_seconds, 4),
                   "iterations": [first.iterations, second.iterations],
                   "product_s": round(first.product_seconds + second.product_seconds, 4),
                   "preconditioner_s": round(first.preconditioner_seconds + second.preconditioner_seconds, 4),
                   "setup_s": round(first.setup_seconds + second.setup_seconds, 4),
                   "residual": [first.residual, second.residual],
                   "restoration_excess": (layer_loss(W, restored, H) - loss1_exact) / loss1_exact,
                   "final_loss_diff": (layer_loss(W, out, H) - final_loss_exact) / final_loss_exact,
                   "unique_masks": unique_masks, "threads": args.threads}
            results.append(row)
            print(f"  {name:28s} restore {restoration:7.3f} s (prod {row['product_s']:.3f}, pre "
                  f"{row['preconditioner_s']:.3f}, setup {row['setup_s']:.3f}) it {row['iterations']} excess "
                  f"{row['restoration_excess']:+.2e} final {row['final_loss_diff']:+.2e} res {first.residual:.1e}",
                  flush=True)
    if not args.no_save:
        save(results, args.label)


def save(rows: list[dict], label: str) -> None:
    import bench

    path = HERE / "results.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    study = data.setdefault("solver_study", {"rows": []})
    study["rows"] = [r for r in study["rows"] if r["set"] != label] + rows
    study.setdefault("commands", {})[label] = " ".join(["python", *sys.argv])
    temporary = path.with_suffix(".study.tmp")
    temporary.write_text(json.dumps(data, indent=2))
    temporary.replace(path)
    bench.write_markdown(data)


def summary(rows: list[dict]) -> list[dict]:
    """Per (set, candidate): total restoration seconds over the linears, speed-up against the Cholesky and the
    Jacobi/1e-4 solver, the worst restoration excess and the mean / worst final-loss difference."""
    out = []
    for label in dict.fromkeys(r["set"] for r in rows):
        subset = [r for r in rows if r["set"] == label]
        for name in dict.fromkeys(r["candidate"] for r in subset):
            mine = [r for r in subset if r["candidate"] == name]
            total = sum(r["restoration_cpu_s"] for r in mine)
            out.append({"set": label, "candidate": name, "linears": len(mine),
                        "restoration_cpu_s": round(total, 2),
                        "iterations_mean": [round(statistics.mean(r["iterations"][i] for r in mine), 1)
                                            for i in range(2)],
                        "product_share": round(sum(r["product_s"] for r in mine) / total, 2) if total else None,
                        "worst_restoration_excess": max(r["restoration_excess"] for r in mine),
                        "final_loss_diff_mean": statistics.mean(r["final_loss_diff"] for r in mine),
                        "final_loss_diff_worst": max(mine, key=lambda r: abs(r["final_loss_diff"]))[
                            "final_loss_diff"]})
    return out


if __name__ == "__main__":
    main()

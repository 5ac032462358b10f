"""Influence power (InP) of actionable variables for avoiding an undesired future (`iclrkit causal influence`).

Paper: Tao, Wang, Jiang, Zhou, "On Measuring Influence in Avoiding Undesired Future" (ICLR 2026),
https://openreview.net/forum?id=VHdF91MvJq. No official code ("Code: TBD"); Rehearsal-LAMDA/Rehearsal-Kit has a
related implementation (enumeration over bins, not the paper's MCTS) — read to compare, nothing copied.

The model is a discrete causal Bayesian network listed in a topological (= decision) order V_1..V_d, Y. Each
variable is `actionable` (may be altered to a value in its action set, or observed), `observed` (observed only)
or `latent` (never available at decision time: always summed out). The AUF probability under alterations A and
observations O is Eq. (12): the truncated factorisation with the altered factors replaced by point masses,
conditioned on O, all other variables summed out. MEP is the max-expected-utility recursion Eqs. (3)-(4) over the
variables after the one measured, and InP is Definition 1: max_v MEP(V_i := v) - E_{v~P(V_i)} MEP(V_i = v).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field

from toolkit.causal.exact import average_causal_effect, influence_exact
from toolkit.causal.mcts import influence_mcts
from toolkit.causal.model import CausalModel, auf_probability
from toolkit.causal.spec import build_model, check_graph, fit_cpts, load_spec, paper_examples, sample
from toolkit.core.config import BaseConfig
from toolkit.core.errors import require
from toolkit.core.records import write_json

__all__ = ["InfluenceConfig", "auf_probability", "average_causal_effect", "build_model", "check_graph", "fit_cpts",
           "influence_exact", "influence_mcts", "load_spec", "paper_examples", "run", "sample"]

class InfluenceConfig(BaseConfig):
    """Influence power by exact enumeration and by the paper's UCT estimator (α = √2)."""

    sem: str = Field(description="Model spec (.yaml/.json with variables, parents, CPTs, roles) or example:1..4.")
    data: str | None = Field(None, description="Observational CSV: CPTs are fitted on it (Eq. 10) instead of "
                                                  "read from the spec, which then only needs the graph.",
                             json_schema_extra={"short": "-d"})
    variables: list[str] | None = Field(None, description="Actionable variable to measure (repeatable; default: "
                                                          "all).", json_schema_extra={"flag": "--variable"})
    given: dict[str, str | int] = Field({}, description="Conditional InP: a value observed before the decision.")
    method: Literal["exact", "mcts", "both"] = Field("both", description="exact enumeration, UCT, or both.")
    iterations: int = Field(2000, ge=1, description="UCT iterations per variable.")
    alpha: float = Field(math.sqrt(2), ge=0, description="UCT exploration constant (paper: √2).")
    backup: Literal["max", "mean"] = Field("max", description="How UCT root values are read: Bellman backup over "
                                                              "the tree, or the plain averages of Eq. (9).")
    smoothing: float = Field(1.0, ge=0, description="Laplace pseudo-count when fitting CPTs on --data.")
    max_joint_size: int = Field(5_000_000, ge=1, description="Refuse models whose joint table is larger.")



def resolve_model(config: InfluenceConfig) -> tuple[CausalModel, dict]:
    """The model named by `sem` (example:N or a spec file), with CPTs fitted on `data` when given."""
    if config.sem.startswith("example:"):
        names = {str(i + 1): e for i, e in enumerate(paper_examples())}
        key = config.sem.split(":", 1)[1]
        require(key in names, f"unknown example '{config.sem}'", "use example:1 .. example:4")
        require(config.data is None, "--data fits a spec file's graph; the paper examples carry their own CPTs")
        return names[key]["model"], {"source": config.sem}
    spec = load_spec(config.sem)
    if config.data is None:
        return build_model(spec), {"source": config.sem}
    require(isinstance(spec, dict) and isinstance(spec.get("variables"), list),
            "the model spec needs a 'variables' list")
    require(all(isinstance(v, dict) and "name" in v for v in spec["variables"]), "every variable needs a 'name'")
    names = [str(v["name"]) for v in spec["variables"]]
    check_graph(names, {str(v["name"]): [str(p) for p in v.get("parents", [])] for v in spec["variables"]})
    cpts, n_rows = fit_cpts(spec, config.data, config.smoothing)
    return build_model(spec, cpts), {"source": config.sem, "fitted_on": config.data, "rows": n_rows}


def measure(model: CausalModel, config: InfluenceConfig, seed: int) -> list[dict]:
    """InP (exact and/or UCT) and ACE for each requested actionable variable, ranked by InP."""
    names = config.variables or [v.name for v in model.variables if v.role == "actionable"]
    require(bool(names), "the model has no actionable variable")
    rows = []
    for name in names:
        row: dict = {"variable": name}
        if config.method in ("exact", "both"):
            row["exact"] = influence_exact(model, name, config.given)
        if config.method in ("mcts", "both"):
            row["mcts"] = influence_mcts(model, name, config.iterations, config.alpha, seed, config.given,
                                        config.backup)
        row["ace"] = average_causal_effect(model, name)
        rows.append(row)
    key = "exact" if config.method != "mcts" else "mcts"
    for rank, row in enumerate(sorted(rows, key=lambda r: -r[key]["inp"]), start=1):
        row["rank_inp"] = rank
    for rank, row in enumerate(sorted(rows, key=lambda r: -abs(r["ace"])), start=1):
        row["rank_ace"] = rank
    return rows


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["variable"] for r in rows]
    series = {"InP (exact)": [r["exact"]["inp"] for r in rows] if "exact" in rows[0] else None,
              "InP (UCT)": [r["mcts"]["inp"] for r in rows] if "mcts" in rows[0] else None,
              "ACE": [r["ace"] for r in rows]}
    series = {k: v for k, v in series.items() if v is not None}
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(labels) + 2), 3.4))
    for i, (label, values) in enumerate(series.items()):
        ax.bar(np.arange(len(labels)) + i * width, values, width, label=label)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(np.arange(len(labels)) + width * (len(series) - 1) / 2, labels)
    ax.set(ylabel="value", title="influence power vs average causal effect")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: InfluenceConfig, ctx) -> dict:
    model, source = resolve_model(config)
    size = int(np.prod([len(v.domain) for v in model.variables]))
    require(size <= config.max_joint_size, f"the joint table has {size} cells (> max_joint_size "
                                           f"{config.max_joint_size})", "coarsen domains or raise max_joint_size")
    rows = measure(model, config, ctx.seed)
    for row in rows:
        key = "exact" if "exact" in row else "mcts"
        ctx.metrics[row["variable"]] = {"inp": round(row[key]["inp"], 6), "ace": round(row["ace"], 6),
                                        "decision": row[key]["decision"]}
        if "exact" in row and "mcts" in row:
            ctx.metrics[row["variable"]]["inp_mcts"] = round(row["mcts"]["inp"], 6)
    if ctx.out is None:  # --json without --out: metrics only
        return {"rows": rows}
    write_json(ctx.path("influence.json"), {"model": source, "given": config.given, "rows": rows})
    plot(rows, ctx.path("influence.png"))
    return {"rows": rows}

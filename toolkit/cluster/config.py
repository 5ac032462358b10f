"""The configs of `iclrkit cluster khc solve | generate` (light to import: the CLI builds its options from them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from toolkit.core.config import BaseConfig

Formulation = Literal["plain", "one", "inf", "multi"]


class KhcConfig(BaseConfig):
    """`iclrkit cluster khc solve`: k-HC2 to proven optimality (SCIP) or by the k-planes heuristic alone."""

    data: str = Field(description="Points: .csv (one row per point, optional header) or .npy (n x d).",
                      json_schema_extra={"short": "-d"})
    k: int = Field(2, ge=1, description="Number of hyperplanes (1 <= k <= n).", json_schema_extra={"flag": "--k",
                                                                                            "short": "-k"})
    formulation: Formulation = Field("inf", description="plain (k-HC(2,1)) | inf (+||w||_inf >= 1/sqrt d) | one "
                                                        "(+||w||_1 >= 1) | multi (both).")
    heuristic_only: bool = Field(False, description="Only the k-planes heuristic (no SCIP).")
    time_limit: float = Field(600.0, gt=0, description="SCIP time limit in seconds.")
    gap: float = Field(0.0, ge=0, description="Stop at this relative primal-dual gap (0 = prove the optimum).")
    node_limit: int = Field(-1, ge=-1, description="Branch-and-bound node limit (-1 = none).")
    threads: int = Field(1, ge=1, description="> 1: SCIP's concurrent solver with this many threads.")
    restarts: int = Field(100, ge=1, description="k-planes restarts for the warm start / upper bound.")
    warm_start: bool = Field(True, description="Give SCIP the heuristic solution as incumbent (a cutoff).")
    norm_branch_priority: bool = True  # branch on the norm binaries u/s first (Prop 4)
    tighten: bool = Field(False, description="Add our valid tightenings (data big-M, ||w||<=1, orbitopal "
                                             "symmetry, cluster sizes, spread point order); not in the paper.")
    plot: bool = Field(True, description="plot.png for 2-D/3-D data.")


class KhcGenerateConfig(BaseConfig):
    """`iclrkit cluster khc generate`: planted instance (paper §5 generator) with noise and outliers."""

    n: int = Field(30, ge=1, description="Number of points.", json_schema_extra={"flag": "--n", "short": "-n"})
    d: int = Field(2, ge=1, description="Dimension d.", json_schema_extra={"flag": "--dim"})
    k: int = Field(3, ge=1, description="Number of planted hyperplanes.", json_schema_extra={"flag": "--k", "short": "-k"})
    noise: float = Field(0.003, ge=0, description="Max noise variance along the normal (paper: 0.003); each plane draws "
                                            "U[0.7 noise, noise].")
    outlier_fraction: float = Field(0.0, ge=0, lt=1, description="Share of points replaced by uniform outliers.",
                                    json_schema_extra={"flag": "--outliers"})
    format: Literal["csv", "npy"] = Field("csv", description="Point file format.")

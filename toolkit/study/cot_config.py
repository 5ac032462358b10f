"""The knobs of `iclrkit study cot` (toolkit.study.cot): knowledge base, model, training and logit lens, each with
the paper's value beside the scaled-down default. Imports no torch (the CLI builds --help from it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from toolkit.core.config import BaseConfig


class CotConfig(BaseConfig):
    """Scaled-down two-hop study; the paper's full scale is |E|=2000, |R|=200, out-degree 20, 8 layers, 20k steps."""

    n_entities: int = Field(200, ge=4, description="|E| (paper: 2000).")
    n_relations: int = Field(20, ge=2, description="|R| (paper: 200).")
    out_degree: int = Field(5, ge=1, description="Random (r, t) pairs per head entity (paper: 20).")
    ood_fraction: float = Field(0.1, gt=0, lt=1, description="Share of atomic facts held out of two-hop training "
                                                             "(paper: 0.05; 0.1 here so the OOD test set is not tiny).")
    phi: float = Field(7.2, gt=0, description="Two-hop train items per ID atomic fact (paper: 7.2).")
    iid_test_fraction: float = Field(0.05, gt=0, lt=1, description="ID two-hop items held out as test_inferred_iid.")
    n_test: int = Field(300, ge=1, description="Items per probe set (id_atomic, iid and OOD two-hop).")
    label_noise: float = Field(0.0, ge=0, lt=1, description="Share of two-hop train items with a random answer t.")
    modes: list[Literal["cot", "nocot"]] = Field(["cot", "nocot"], min_length=1,
                                                 description="cot and/or nocot (repeatable): one model per target "
                                                             "format.")
    n_layer: int = Field(4, ge=1, description="GPT-2 blocks (paper: 8).")
    n_embd: int = Field(128, ge=8, description="Residual width.")
    n_head: int = Field(4, ge=1, description="Attention heads (paper: 12).")
    steps: int = Field(2000, ge=1, description="Training (AdamW) steps per model (paper: 20k).")
    batch_size: int = Field(128, ge=1, description="Sequences per step (paper: 512).")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (paper: 1e-4 at 20k steps; higher when scaled down).")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (paper: 0.1).")
    warmup: int = Field(100, ge=0, description="Linear warm-up steps, then constant (paper: 2000).")
    eval_every: int = Field(250, ge=1, description="Steps between accuracy evaluations.")
    lens_position: Literal["r1", "r2", "either"] = Field(
        "r2", description="Where bridge_layer reads the logit lens. r2 (the last prompt token, where the answer is "
                          "produced) by default: r1 is also trained by the one-hop items `h r -> t` to emit the "
                          "tail of (h, r), which is b, so it measures the atomic skill in both formats.")
    threads: int = Field(1, ge=1, description="torch CPU threads (1 is fastest on a shared 2-core machine).")

    @model_validator(mode="after")
    def _check(self) -> CotConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        if self.out_degree > self.n_relations:
            raise ValueError(f"out_degree {self.out_degree} > n_relations {self.n_relations}: a head has one tail "
                             "per relation")
        return self

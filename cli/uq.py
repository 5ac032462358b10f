"""`iclrkit uq`: uncertainty quantification for LLM reasoning (TokUR)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli._options import (
    ConfigOpt,
    DataOpt,
    DeviceOpt,
    DryRunOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Uncertainty quantification.")


@app.command("tokur", help="Token-level total/aleatoric/epistemic uncertainty by low-rank weight perturbation; "
                           "AUROC vs correctness and best-of-N selection.",
             epilog="Examples: iclrkit uq tokur -m zoo:smollm2-135m -d ../shared/data/gsm8k/test.jsonl --limit 20 "
                    "-o runs/tokur | iclrkit uq tokur -m ./toy -d toy.jsonl --sigma 0.05 --samples 8 -o runs/toy --json")
def tokur(
    model: ModelOpt,
    data: DataOpt = None,
    samples: Annotated[Optional[int], typer.Option(help="M perturbed models scoring each response.")] = None,
    rank: Annotated[Optional[int], typer.Option(help="Rank of the weight perturbation.")] = None,
    sigma: Annotated[Optional[str], typer.Option(help="Perturbation scale, or 'auto' (≤1% NLL change).")] = None,
    candidates: Annotated[Optional[int], typer.Option(help="Responses per question (best-of-N).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Use the first N questions.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Response length cap.")] = None,
    score: Annotated[Optional[str], typer.Option(help="total | aleatoric | epistemic (selection and AUROC).")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.uq.run import TokURConfig, run_tokur

    sigma_value = sigma if sigma in (None, "auto") else _number(sigma)
    execute(technique="uq.tokur", config_cls=TokURConfig,
            flags={"model": model, "data": data, "samples": samples, "rank": rank, "sigma": sigma_value,
                   "candidates": candidates, "limit": limit, "max_new_tokens": max_new_tokens, "score": score},
            common=Common.of(locals()),
            run=run_tokur, inputs={"data": data})


def _number(text: str):
    """A float when the flag parses as one; otherwise the text, which the config then rejects clearly."""
    try:
        return float(text)
    except ValueError:
        return text

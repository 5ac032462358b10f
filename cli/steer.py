"""`iclrkit steer pcms|ums|ilcs|generate|sweep`: personalized safety steering by activation intervention."""

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

app = typer.Typer(no_args_is_help=True, help="Personalized safety steering (PCMS, UMS, ILCS).")

LayerOpt = Annotated[Optional[list[int]], typer.Option("--layer", help="Block index (repeatable).")]
PositionOpt = Annotated[Optional[str], typer.Option(help="Read activations at the 'last' token or the 'mean'.")]

ESTIMATORS = {
    "pcms": "Paired Contrast Mean Shift: mean of topic-matched pair differences (the paper's method).",
    "ums": "Unpaired Mean Shift: difference of the undesired and neutral means.",
    "ilcs": "Instance-Level Contrast Shift: the difference of one contrast pair.",
}


def _estimate_command(method: str):
    def command(
        model: ModelOpt,
        data: DataOpt = None,
        layer: LayerOpt = None,
        position: PositionOpt = None,
        out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
        device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
        overwrite: OverwriteOpt = False,
    ) -> None:
        from toolkit.steer.run import SteerConfig, run_estimate

        execute(technique=f"steer.{method}", config_cls=SteerConfig,
                flags={"model": model, "data": data, "method": method, "layers": layer or None, "position": position},
                common=Common.of(locals()),
                run=run_estimate, inputs={"data": data})
    return command


for _name, _help in ESTIMATORS.items():
    app.command(_name, help=f"{_help} Writes directions.safetensors (layer + model fingerprint).",
                epilog=f"Examples: iclrkit steer {_name} -m zoo:smollm2-135m -d pairs.jsonl --layer 15 -o dirs/ | "
                       "pairs.jsonl lines: {\"undesired\": \"...\", \"neutral\": \"...\"}")(_estimate_command(_name))


@app.command("generate", help="Generate with saved directions subtracted (h - alpha*v, or projection removal).",
             epilog="Examples: iclrkit steer generate -m zoo:smollm2-135m --direction dirs/directions.safetensors "
                    "--alpha 1 --prompt 'The soldier drew his sword and' -o gen/")
def generate(
    model: ModelOpt,
    direction: Annotated[Optional[list[str]], typer.Option("--direction", help="directions.safetensors (repeatable: categories add up).")] = None,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="Prompt text (repeatable).")] = None,
    data: DataOpt = None,
    alpha: Annotated[Optional[float], typer.Option(help="Steering strength.")] = None,
    operator: Annotated[Optional[str], typer.Option(help="add (h - alpha*v) | ablate (remove the projection) | clip (remove only the excess over --set clip_threshold=T).")] = None,
    layer: LayerOpt = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Tokens to generate.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.steer.run import GenerateConfig, run_generate

    execute(technique="steer.generate", config_cls=GenerateConfig,
            flags={"model": model, "directions": direction or None, "prompts": prompt or None, "data": data,
                   "alpha": alpha, "operator": operator, "layers": layer or None, "max_new_tokens": max_new_tokens},
            common=Common.of(locals()),
            run=run_generate, inputs={"data": data})


@app.command("sweep", help="Method x layer x alpha grid: category probability drop (lexicon + MiniLM classifier), "
                           "neutral KL, neutral perplexity ratio, split-half cosine; results.json + sweep.png.",
             epilog="Examples: iclrkit steer sweep -m zoo:smollm2-135m -d pairs.jsonl --prompts prompts.jsonl "
                    "--config examples/steer/config.yaml -o sweep/")
def sweep(
    model: ModelOpt,
    data: DataOpt = None,
    prompts: Annotated[Optional[str], typer.Option(help="JSONL {prompt, kind: category|neutral}.")] = None,
    layer: LayerOpt = None,
    alpha: Annotated[Optional[list[float]], typer.Option("--alpha", help="Strength (repeatable).")] = None,
    method: Annotated[Optional[list[str]], typer.Option("--method", help="pcms | ums | ilcs (repeatable).")] = None,
    operator: Annotated[Optional[str], typer.Option(help="add | ablate | clip.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.steer.run import SweepConfig, run_sweep

    execute(technique="steer.sweep", config_cls=SweepConfig,
            flags={"model": model, "data": data, "prompts": prompts, "layers": layer or None, "alphas": alpha or None,
                   "methods": method or None, "operator": operator},
            common=Common.of(locals()),
            run=run_sweep, inputs={"data": data, "prompts": prompts})

"""`iclrkit prompt`: prompt inference (MHLP / Textual Bayes)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli._llm_options import ConcurrencyOpt, server_concurrency
from cli._options import ConfigOpt, DeviceOpt, DryRunOpt, DtypeOpt, JsonOpt, OutOpt, OverwriteOpt, SeedOpt, SetOpt
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Prompt inference.")


@app.command("mhlp", help="Bayesian inference over the system prompt: MH with LLM proposals (Textual Bayes).",
             epilog="Examples: iclrkit prompt mhlp --task-model zoo:smollm2-135m --proposer-model zoo:smollm2-135m "
                    "-d qa.jsonl -o runs/mhlp | iclrkit prompt mhlp --task-model openai:m@http://host:8000/v1 "
                    "--proposer-model openai:m@http://host:8000/v1 -d qa.jsonl --steps 20 -o out --json")
def mhlp(
    task_model: Annotated[str, typer.Option("--task-model", help="Model answering questions (path, zoo:NAME, "
                                            "openai:MODEL@URL).")],
    proposer_model: Annotated[str, typer.Option("--proposer-model", help="Critique/rewrite model; must score "
                                                "supplied text.")],
    data: Annotated[Optional[str], typer.Option("--data", "-d", help="JSONL with question and answer.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="MH steps per chain (one example each).")] = None,
    burn_in: Annotated[Optional[int], typer.Option(help="States dropped at the chain start.")] = None,
    thinning: Annotated[Optional[int], typer.Option(help="Keep every k-th state.")] = None,
    chains: Annotated[Optional[int], typer.Option(help="Independent chains.")] = None,
    beta: Annotated[Optional[float], typer.Option(help="Likelihood temperature β.")] = None,
    initial_prompt: Annotated[Optional[str], typer.Option(help="Starting system prompt.")] = None,
    meta_prompt: Annotated[Optional[str], typer.Option(help="Free-text prior belief about good prompts.")] = None,
    eval_size: Annotated[Optional[int], typer.Option(help="Evaluation examples.")] = None,
    train_size: Annotated[Optional[int], typer.Option(help="Chain examples.")] = None,
    predictive: Annotated[Optional[str], typer.Option(help="Posterior predictive: 'sample' (answer frequencies, "
                                                      "official) or 'score' (class-word log-probs averaged over "
                                                      "the samples; classification).")] = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="Use the chat template for generation "
                                                 "and scoring (instruct models; local models only).")] = None,
    concurrency: ConcurrencyOpt = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.prompt.run import MHLPConfig, run_mhlp

    with server_concurrency(concurrency):
        execute(technique="prompt.mhlp", config_cls=MHLPConfig,
                flags={"task_model": task_model, "proposer_model": proposer_model, "data": data, "steps": steps,
                       "burn_in": burn_in, "thinning": thinning, "chains": chains, "beta": beta,
                       "initial_prompt": initial_prompt, "meta_prompt": meta_prompt, "eval_size": eval_size,
                       "train_size": train_size, "predictive": predictive, "chat": chat},
                common=Common.of(locals()),
                run=run_mhlp, inputs={"data": data})

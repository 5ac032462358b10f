"""`iclrkit rag`: retrieval-augmented generation (DeepRAG: index, synth, train, run)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli._llm_options import ConcurrencyOpt, server_concurrency
from cli._options import (
    ConfigOpt,
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

app = typer.Typer(no_args_is_help=True, help="Retrieval-augmented generation.")
deeprag = typer.Typer(no_args_is_help=True, help="DeepRAG: step-wise retrieve-or-answer decisions (ICLR 2026).")
app.add_typer(deeprag, name="deeprag")

QAData = Annotated[str, typer.Option("--data", "-d", help="QA JSONL: HotpotQA (IRCoT or raw), FlashRAG/NQ, or "
                                     "{question, answer[s], decomposition?}.")]
IndexOpt = Annotated[str, typer.Option("--index", help="Index directory from `rag deeprag index`, or 'contexts' "
                                       "(BM25 over each question's own paragraphs).")]
LimitOpt = Annotated[Optional[int], typer.Option(help="Use only the first N questions.")]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", help="Passages per retrieval.")]


@deeprag.command("index", help="Build a BM25 (bm25s) or dense (FAISS + MiniLM) index over a passage corpus.",
                 epilog="Examples: iclrkit rag deeprag index --corpus passages.jsonl -o runs/idx | iclrkit rag "
                        "deeprag index --corpus hotpot.jsonl --retriever dense -o runs/idx-dense")
def index(
    corpus: Annotated[str, typer.Option(help="Passages JSONL ({id,title,text} or {id,contents}) or a HotpotQA file.")],
    retriever: Annotated[Optional[str], typer.Option(help="bm25 | dense.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.rag.deeprag import IndexConfig, run_index

    execute(technique="rag.deeprag.index", config_cls=IndexConfig, flags={"corpus": corpus, "retriever": retriever},
            common=Common.of(locals()), run=run_index, inputs={"corpus": corpus})


@deeprag.command("synth", help="Binary-tree search for minimum-retrieval trajectories + calibration pairs (paper "
                 "defaults; --set policy=always|never writes the baselines' own training paths).",
                 epilog="Examples: iclrkit rag deeprag synth -m zoo:smollm2-135m -d train.jsonl --index runs/idx "
                        "-o runs/synth | iclrkit rag deeprag synth -m openai:m@http://127.0.0.1:8000/v1 -d train.jsonl "
                        "--index runs/idx -o runs/synth --json")
def synth(
    model: ModelOpt, data: QAData, index: IndexOpt,
    top_k: TopKOpt = None, limit: LimitOpt = None,
    max_depth: Annotated[Optional[int], typer.Option(help="Most sub-questions per path.")] = None,
    decompose: Annotated[Optional[str], typer.Option(help="model (the paper: the model writes them under the few-shot "
                                                     "decomposition prompt) | gold (ablation: the data's "
                                                     "`decomposition`) | auto (gold when present).")] = None,
    concurrency: ConcurrencyOpt = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.rag.deeprag import SynthConfig, run_synth

    with server_concurrency(concurrency):
        execute(technique="rag.deeprag.synth", config_cls=SynthConfig,
                flags={"model": model, "data": data, "index": index, "top_k": top_k, "limit": limit,
                       "max_depth": max_depth, "decompose": decompose},
                common=Common.of(locals()), run=run_synth, inputs={"data": data})


@deeprag.command("train", help="Imitation learning (SFT, retrieved context masked) then chain of calibration (DPO).",
                 epilog="Examples: iclrkit rag deeprag train -m zoo:smollm2-135m -d runs/synth -o runs/deeprag-model "
                        "| iclrkit rag deeprag train -m ./base -d runs/synth --set sft_lr=1e-4 --set stages=[sft] -o out")
def train(
    model: ModelOpt,
    data: Annotated[str, typer.Option("--data", "-d", help="A `rag deeprag synth` output directory.")],
    sft_epochs: Annotated[Optional[float], typer.Option(help="Stage I epochs.")] = None,
    dpo_epochs: Annotated[Optional[float], typer.Option(help="Stage II epochs.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.rag.deeprag import TrainConfig, run_train

    execute(technique="rag.deeprag.train", config_cls=TrainConfig,
            flags={"model": model, "data": data, "sft_epochs": sft_epochs, "dpo_epochs": dpo_epochs},
            common=Common.of(locals()), run=run_train, inputs={"data": data, "model": model})


@deeprag.command("run", help="Answer questions with DeepRAG and baselines; EM/F1 and retrievals per question.",
                 epilog="Examples: iclrkit rag deeprag run -m runs/deeprag-model/model -d test.jsonl --index runs/idx "
                        "--methods deeprag,always,never,single -o runs/eval | iclrkit rag deeprag run -m "
                        "zoo:smollm2-135m -d hotpot.jsonl --index contexts --limit 30 -o runs/hotpot --json")
def run(
    model: ModelOpt, data: QAData, index: IndexOpt,
    methods: Annotated[Optional[str], typer.Option(help="Comma list of deeprag, always, never, single.")] = None,
    top_k: TopKOpt = None, limit: LimitOpt = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Most sub-questions per answer.")] = None,
    concurrency: ConcurrencyOpt = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.rag.deeprag import RunConfig, run_run

    with server_concurrency(concurrency):
        execute(technique="rag.deeprag.run", config_cls=RunConfig,
                flags={"model": model, "data": data, "index": index, "top_k": top_k, "limit": limit,
                       "max_steps": max_steps,
                       "methods": [m.strip() for m in methods.split(",") if m.strip()] if methods else None},
                common=Common.of(locals()), run=run_run, inputs={"data": data})

"""`iclrkit rag`: retrieval-augmented generation (DeepRAG: index, synth, train, run).

Options come from the configs' fields (toolkit/rag/config.py): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import STANDARD, config_command
from toolkit.rag.config import IndexConfig, RunConfig, SynthConfig, TrainConfig

app = typer.Typer(no_args_is_help=True, help="Retrieval-augmented generation.")
deeprag = typer.Typer(no_args_is_help=True, help="DeepRAG: step-wise retrieve-or-answer decisions (ICLR 2026).")
app.add_typer(deeprag, name="deeprag")
QA_FLAGS = ["model", "data", "index", "top_k", "limit"]

# name: (config, options, common options, help, epilog); each runs toolkit.rag.deeprag:run_NAME
COMMANDS = {
    "index": (
        IndexConfig, ["corpus", "retriever"], STANDARD,
        "Build a BM25 (bm25s) or dense (FAISS + MiniLM) index over a passage corpus.",
        "Examples: iclrkit rag deeprag index --corpus passages.jsonl -o runs/idx | iclrkit rag deeprag index "
        "--corpus hotpot.jsonl --retriever dense -o runs/idx-dense"),
    "synth": (
        SynthConfig, [*QA_FLAGS, "max_depth", "decompose", "concurrency"], (*STANDARD, "dtype"),
        "Binary-tree search for minimum-retrieval trajectories + calibration pairs (paper defaults; --set "
        "policy=always|never writes the baselines' own training paths).",
        "Examples: iclrkit rag deeprag synth -m zoo:smollm2-135m -d train.jsonl --index runs/idx -o runs/synth | "
        "iclrkit rag deeprag synth -m openai:m@http://127.0.0.1:8000/v1 -d train.jsonl --index runs/idx "
        "--concurrency 8 -o runs/synth --json"),
    "train": (
        TrainConfig, ["model", "data", "sft_epochs", "dpo_epochs"], (*STANDARD, "dtype"),
        "Imitation learning (SFT, retrieved context masked) then chain of calibration (DPO).",
        "Examples: iclrkit rag deeprag train -m zoo:smollm2-135m -d runs/synth -o runs/deeprag-model | iclrkit "
        "rag deeprag train -m ./base -d runs/synth --set sft_lr=1e-4 --set stages=[sft] -o out"),
    "run": (
        RunConfig, [*QA_FLAGS, "methods", "max_steps", "concurrency"], (*STANDARD, "dtype"),
        "Answer questions with DeepRAG and baselines; EM/F1 and retrievals per question.",
        "Examples: iclrkit rag deeprag run -m runs/deeprag-model/model -d test.jsonl --index runs/idx "
        "--methods deeprag,always,never,single -o runs/eval | iclrkit rag deeprag run -m zoo:smollm2-135m "
        "-d hotpot.jsonl --index contexts --limit 30 -o runs/hotpot --json"),
}

for _name, (_config, _flags, _common, _help, _epilog) in COMMANDS.items():
    # model and data are protected from --out by the runner; the index command's corpus is named here
    config_command(deeprag, _name, config=_config, run=f"toolkit.rag.deeprag:run_{_name}",
                   technique=f"rag.deeprag.{_name}", help=_help, epilog=_epilog, flags=_flags, common=_common,
                   inputs=lambda f: {"corpus": f.get("corpus")})

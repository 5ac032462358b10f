"""`iclrkit export compressed-tensors|gguf RUN_DIR --out DIR`: convert a compress run's packed/ output to a format
transformers / vLLM (compressed-tensors) or llama.cpp (GGUF Q4_0) serve."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import JsonOpt, OutOpt, OverwriteOpt
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Export compressed models to formats inference engines serve.")

RunDirArg = Annotated[str, typer.Argument(help="A compress run directory (with packed/) or a packed/ directory.")]


def _run(fmt: str, run_dir: str, common: Common) -> None:
    from toolkit.export.run import ExportConfig, run_export

    execute(technique=f"export.{fmt}", config_cls=ExportConfig, flags={"run_dir": run_dir, "format": fmt},
            common=common, run=run_export, inputs={"run_dir": run_dir})


@app.command("compressed-tensors", help="Weight-only INT (W4A16) as compressed-tensors pack-quantized: "
             "AutoModelForCausalLM.from_pretrained(OUT) and `vllm serve OUT` load it.",
             epilog="Examples: iclrkit export compressed-tensors runs/rtn-w4 --out runs/rtn-w4-ct | "
                    "iclrkit export compressed-tensors runs/rtn-w4/packed -o out --overwrite")
def compressed_tensors(run_dir: RunDirArg, out: OutOpt = None, json_: JsonOpt = False,
                       overwrite: OverwriteOpt = False) -> None:
    _run("compressed-tensors", run_dir, Common.of(locals(), device="cpu"))


@app.command("gguf", help="GGUF Q4_0 for llama.cpp (every architecture llama.cpp has a loader for; 4-bit weights).",
             epilog="Examples: iclrkit export gguf runs/rtn-w4 --out runs/rtn-w4-gguf && "
                    "llama-cli -m runs/rtn-w4-gguf/model-Q4_0.gguf -p Hello")
def gguf(run_dir: RunDirArg, out: OutOpt = None, json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    _run("gguf", run_dir, Common.of(locals(), device="cpu"))

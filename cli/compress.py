"""`iclrkit compress METHOD`: joint quantization + sparsification on one shared recipe.

One command per method registered in toolkit/compress/methods/ (OBR, its baselines, magnitude, ...), with the
options its registration names, generated from the config fields (toolkit/compress/config.py): a new method is one
file there and appears here by itself. `compress recipe --recipe FILE.yaml` composes registered stages
([sparsegpt, gptq], [rotate, obr], [smooth, gptq]; toolkit/compress/stages.py)."""

from __future__ import annotations

import typer

import toolkit.compress.config  # noqa: F401 - declares the registry's method modules (torch-free)
from cli._fields import STANDARD, config_command
from cli.compress_bench import register as register_bench
from toolkit.core.registry import registry

app = typer.Typer(no_args_is_help=True,
                  help="Compress LLMs: OBR and its baselines (quantization + sparsity); `compress recipe --recipe "
                       "FILE.yaml` composes stages ([sparsegpt, gptq], [rotate, obr], [smooth, gptq]).")

EXAMPLES = ("Examples: iclrkit compress {cmd} --model zoo:llama-small --data valid.txt --eval-data test.txt "
            "--w-bits 4 --a-bits 4 --kv-bits 4 --sparsity 0.5 --out runs/{cmd} | add --dry-run for the plan, "
            "--resume to continue a killed run")

for _method in registry("compress"):
    config_command(
        app, _method.name, config=_method.config, run="toolkit.compress.recipe:run_compress",
        plan="toolkit.compress.recipe:plan", technique=f"compress.{_method.name}", help=_method.meta["help"],
        epilog=_method.meta.get("epilog", EXAMPLES.format(cmd=_method.name)), flags=_method.meta["flags"],
        common=(*STANDARD, "dtype", "resume"),
        inputs=lambda f: {k: f[k] for k in ("data", "eval_data", "recipe") if k in f})

register_bench(app)

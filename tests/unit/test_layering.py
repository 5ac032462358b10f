"""The house's layering, checked on the source: every module imports in a fresh interpreter; toolkit.core imports
nothing above it; the kernel layer (toolkit.ops) imports no technique; infrastructure imports no technique; no
import circles (function-level imports included: a deferred import is still an arrow)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INFRA = {"core", "ops", "linalg", "models", "data", "nn", "eval", "llm", "zoo"}


def _modules() -> dict[str, Path]:
    found = {}
    for base in ("toolkit", "cli"):
        for path in sorted((ROOT / base).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.split(".")[0] in ("toolkit", "cli")}


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


GRAPH = {m: {r for n in _imports(p) if (r := _resolve(n)) and r != m and r not in ("toolkit", "cli")}
         for m, p in MODULES.items()}


def _family(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "toolkit" and len(parts) > 1 else parts[0]


def test_every_module_imports_in_a_fresh_interpreter():
    names = [m for m in MODULES if not m.endswith("__main__")]
    code = ("import importlib, sys\nbad = []\nfor name in sys.argv[1:]:\n    try:\n        importlib.import_module(name)\n"
            "    except Exception as exc:\n        bad.append(f'{name}: {type(exc).__name__}: {exc}')\nprint('\\n'.join(bad))\n"
            "sys.exit(1 if bad else 0)\n")
    result = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_core_imports_nothing_above_it():
    bad = [(m, d) for m, deps in GRAPH.items() if _family(m) == "core" for d in deps if _family(d) != "core"]
    assert not bad, bad


def test_kernel_layer_imports_no_technique():
    bad = [(m, d) for m, deps in GRAPH.items() if _family(m) == "ops" for d in deps
           if _family(d) not in ("core", "ops")]
    assert not bad, bad


def test_infrastructure_imports_no_technique():
    bad = [(m, d) for m, deps in GRAPH.items() if m.startswith("toolkit.") and _family(m) in INFRA
           for d in deps if d.startswith("toolkit.") and _family(d) not in INFRA]
    assert not bad, bad


def test_no_import_circles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not cycles, cycles


def test_cli_main_imports_no_torch():
    code = "import sys, cli.main; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", result.stdout


def test_no_module_is_a_god_module():
    """~350 lines at most per module (the issue's bound; a few data tables are allowed above it)."""
    allowed: set[str] = set()
    big = {str(p.relative_to(ROOT)): n for p in MODULES.values()
           if (n := len(p.read_text().splitlines())) > 350 and str(p.relative_to(ROOT)) not in allowed}
    assert not big, big

"""No function in toolkit/ over 50 lines unless a `# long:` comment right above it says why (a training loop,
one optimisation model, ...): long functions are split along their seams."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 50
# modules being split in a concurrent refactor, skipped until their owner lands it (none now)
PENDING: set[str] = set()


def test_long_functions_say_why():
    found = []
    for path in sorted((ROOT / "toolkit").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in PENDING:
            continue
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                above = "\n".join(lines[max(0, first - 4):first - 1])
                if length > LIMIT and "# long:" not in above:
                    found.append(f"{relative}:{node.lineno} {node.name} ({length} lines)")
    assert not found, "split these along their seams, or say why above them (# long: ...):\n" + "\n".join(found)

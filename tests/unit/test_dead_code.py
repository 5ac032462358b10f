"""No dead code in toolkit/ and cli/: every module-level function and class (and every shared option in
cli/_options.py) is referenced somewhere besides its own definition — in toolkit/, cli/, examples/, scripts/ or the
tests — or registered by a decorator, or named here with the reason it is reached without its name being
written. A vulture-style check on names: it fails when the last user of a function goes away."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# reached through a name built at run time: the CLI's f-string "module:run_{name}" / "plan_{name}" lookups
DYNAMIC = {
    "toolkit/rag/deeprag.py": {"run_index", "run_synth", "run_run"},  # cli/rag.py: run_{name}
    "toolkit/bench/mmsearch_run.py": {"run_mmsearch", "plan_mmsearch"},  # cli/bench.py: run_/plan_{name}
    "toolkit/bench/videomathqa_run.py": {"run_videomathqa", "plan_videomathqa"},
}
REGISTERS = re.compile(r"register|\.command|\.callback")


def _word_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    files = [p for d in ("toolkit", "cli", "examples", "scripts", "tests") for p in (ROOT / d).rglob("*.py")]
    files += list((ROOT / "examples").rglob("*.sh")) + [ROOT / "setup.py", ROOT / "Makefile"]
    for path in files:
        if path.is_file():
            for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text()):
                counts[word] = counts.get(word, 0) + 1
    return counts


def _definitions(path: Path):
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            registered = any(REGISTERS.search(ast.get_source_segment(source, d) or "") for d in node.decorator_list)
            if not node.name.startswith("__") and not registered:
                yield node.name, node.lineno
        elif path.name == "_options.py" and isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node.lineno


def test_every_module_level_function_has_a_user():
    counts = _word_counts()
    unused = []
    for path in sorted(p for d in ("toolkit", "cli") for p in (ROOT / d).rglob("*.py")):
        allowed = DYNAMIC.get(path.relative_to(ROOT).as_posix(), set())
        for name, line in _definitions(path):
            if counts.get(name, 0) <= 1 and name not in allowed:
                unused.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert not unused, "unused (delete, or name the dynamic lookup in DYNAMIC):\n" + "\n".join(unused)


def test_the_dynamic_names_still_exist():
    for relative, names in DYNAMIC.items():
        defined = {name for name, _ in _definitions(ROOT / relative)}
        assert names <= defined, relative

"""#24 item 2, "no device checks in the op wrappers": the Python side of every kernel (toolkit/ops, the MBU-Net bit
kernels, their load-time prepack and the packed layers) leaves the device to the dispatcher. A static scan: no
`.device.type`, `.is_cuda`, `.cpu()` or `torch.cuda.is_available()` in those modules, but for the few functions named
below, each for a reason that is not per-call routing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRAPPERS = sorted((ROOT / "toolkit" / "ops").glob("*.py")) + [
    ROOT / "toolkit" / "segment" / name for name in ("kernels.py", "prepack.py", "packed.py")]
ALLOWED = {
    # the fake (meta) implementation names the layout the device's kernel builds: shape propagation, not routing
    ("prepack.py", "_kernel_layout"),
    # storage: the packed file holds numpy-packed bits (save path, once per save)
    ("packed.py", "_dense_bits"),
    # a benchmark's clock: synchronise CUDA before reading the time
    ("packed.py", "time_layers"),
}


def _device_checks(path: Path) -> list[tuple[str, int, str]]:
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name if function == "<module>" else function
        what = None
        if isinstance(node, ast.Attribute) and node.attr == "type" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "device":
            what = ".device.type"
        elif isinstance(node, ast.Attribute) and node.attr == "type" and isinstance(node.value, ast.Name) \
                and node.value.id == "device":
            what = "device.type"
        elif isinstance(node, ast.Attribute) and node.attr == "is_cuda":
            what = ".is_cuda"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cpu" \
                and not node.args:
            what = ".cpu()"
        elif isinstance(node, ast.Attribute) and node.attr == "is_available" and "cuda" in ast.unparse(node.value):
            what = "torch.cuda.is_available()"
        if what and (path.name, function) not in ALLOWED:
            found.append((function, node.lineno, what))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_the_scan_sees_what_it_looks_for(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(x, device):\n    if x.device.type == 'cuda' or x.is_cuda or device.type == 'cpu':\n"
                     "        return x.cpu()\n    return torch.cuda.is_available()\n")
    assert {what for _, _, what in _device_checks(probe)} == {".device.type", "device.type", ".is_cuda", ".cpu()",
                                                             "torch.cuda.is_available()"}


@pytest.mark.parametrize("path", WRAPPERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_op_wrappers_carry_no_device_checks(path):
    assert path.is_file()
    assert _device_checks(path) == [], f"device checks in {path.relative_to(ROOT)}"

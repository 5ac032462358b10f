"""The architecture matrix in the suite: every model command on a tiny random model of every architecture
(toolkit.models.tiny), the cells of scripts/arch_matrix.py — each a numeric check or a refusal with its declared
reason (scripts/arch_matrix.EXPECTED_REFUSALS); examples/models/MATRIX.md is that script's rendering."""

from pathlib import Path

import pytest
from testkit import load_script

from toolkit.models.tiny import ARCHITECTURES

MATRIX = load_script(Path(__file__).resolve().parents[2] / "scripts" / "arch_matrix.py", "arch_matrix")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def matrix_root(tmp_path_factory):
    return tmp_path_factory.mktemp("matrix")


@pytest.mark.parametrize("cell", MATRIX.CELLS)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_cell(arch, cell, matrix_root, tiny_tokenizer):
    result = MATRIX.run_cell(arch, cell, matrix_root, tiny_tokenizer)
    assert result.status != "fail", f"{arch}/{cell}: {result.detail}"


def test_every_declared_refusal_names_a_real_cell():
    for arch, cell in MATRIX.EXPECTED_REFUSALS:
        assert arch in ARCHITECTURES and cell in MATRIX.CELLS


def test_committed_table_lists_every_architecture_and_command():
    text = (Path(__file__).resolve().parents[2] / "examples" / "models" / "MATRIX.md").read_text()
    for arch in ARCHITECTURES:
        assert f"| {arch} |" in text
    assert all(cell in text for cell in MATRIX.CELLS)
    assert "✗" not in text  # the committed rendering has no failed cell

"""The INT4 Tensor Core kernels compile for sm_80 and sm_90 with plain nvcc (no GPU needed)."""

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "csrc" / "int4" / "int4_gemm_cuda.cu"
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_int4_cuda_kernels_compile(tmp_path):
    result = subprocess.run([NVCC, "-c", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                             "arch=compute_90,code=sm_90", str(SOURCE), "-o", str(tmp_path / "int4.o")],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "int4.o").stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:  # the integer Tensor Core instructions really are emitted
        listing = subprocess.run([cuobjdump, "-sass", str(tmp_path / "int4.o")], capture_output=True, text=True, check=False)
        assert "IMMA" in listing.stdout

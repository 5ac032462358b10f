"""tests/gpu: the CUDA kernels against the CPU / integer references. Skipped only where torch sees no CUDA device;
with a CUDA device present, a toolkit._C without the CUDA kernels FAILS every test here (a GPU check that skipped
its kernels would prove nothing)."""

from __future__ import annotations

import pytest
import torch

CUDA_OPS = ("int4_gemm", "int4_gemm_24", "int4_gemm_s4", "w4a16_gemm", "ternary_conv2d", "ternary_conv2d_sign",
            "ternary_prepack", "ternary_conv2d_prepacked", "ternary_conv2d_sign_prepacked")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def require_cuda_kernels():
    from toolkit.ops import has_op, load_extension

    built, detail = load_extension()
    missing = [name for name in CUDA_OPS if not has_op(name, "cuda")]
    if missing:
        pytest.fail(f"CUDA device present but toolkit._C has no CUDA kernel for {missing} ({detail}); build it with "
                    "CUDA: `make gpu-check` or CUDA_HOME=... python setup.py build_ext --inplace", pytrace=False)

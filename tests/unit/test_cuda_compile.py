"""Every CUDA translation unit compiles with the development machines' nvcc (CUDA_HOME, default /usr/local/cuda),
`-c` only, no GPU needed: each csrc/**/*.cu for sm_80 and sm_90, and each CUDA host launcher (.cpp files with a
`TORCH_LIBRARY_IMPL(iclrkit, CUDA, ...)` block) with -DICLRKIT_WITH_CUDA against the installed torch's headers, as
setup.py's CUDA build compiles them. All compilers run in parallel.

A CPU-only torch wheel ships the ATen/cuda and c10/cuda headers but not the one CMake-generated header
c10/cuda/impl/cuda_cmake_macros.h (on Linux it only defines C10_CUDA_BUILD_SHARED_LIBS, which changes nothing but
Windows dllexport); torch's own C10_CUDA_NO_CMAKE_CONFIGURE_FILE switch skips it. With a CUDA torch the flag is not
passed. Also checked statically: every op a CUDA block registers is defined (one name for CPU and CUDA), and the
prepacked ternary conv kernels call no weight re-layout (the layout is built once by `ternary_prepack`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
CUDA_HOME = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
NVCC = str(CUDA_HOME / "bin" / "nvcc") if (CUDA_HOME / "bin" / "nvcc").exists() else shutil.which("nvcc")
ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
CUDA_BLOCK = re.compile(r"TORCH_LIBRARY_IMPL\(iclrkit,\s*CUDA")

KERNELS = sorted(CSRC.rglob("*.cu"))
LAUNCHERS = sorted(p for p in CSRC.rglob("*.cpp") if CUDA_BLOCK.search(p.read_text()))
UNITS = KERNELS + LAUNCHERS


def _torch_flags() -> list[str]:
    import torch
    from torch.utils.cpp_extension import include_paths

    flags = [f"-I{path}" for path in include_paths()]
    flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    if torch.version.cuda is None:
        flags.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
    return flags


def _command(source: Path, out: Path) -> list[str]:
    common = [NVCC, "-c", "-std=c++17", "-DICLRKIT_WITH_CUDA", "-DTORCH_EXTENSION_NAME=_C", *_torch_flags()]
    if source.suffix == ".cu":
        return [*common, "-O3", *ARCHS, str(source), "-o", str(out)]
    # host code: nvcc hands it to the host compiler with the CUDA include path, as setup.py's CUDA build compiles it
    return [*common, "-O0", "-Xcompiler", "-fPIC", str(source), "-o", str(out)]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if NVCC is None:
        pytest.skip(f"nvcc not found (CUDA_HOME={CUDA_HOME}, PATH): cannot compile the CUDA sources")
    out_dir = tmp_path_factory.mktemp("cuda_objects")

    def build(source: Path):
        out = out_dir / (source.relative_to(CSRC).as_posix().replace("/", "_") + ".o")
        result = subprocess.run(_command(source, out), capture_output=True, text=True, timeout=900, check=False)
        return source, out, result

    with ThreadPoolExecutor(max_workers=len(UNITS)) as pool:
        return {source: (out, result) for source, out, result in pool.map(build, UNITS)}


def test_every_cuda_unit_is_found():
    names = {p.name for p in UNITS}
    assert {"int4_gemm_cuda.cu", "w4a16_cuda.cu", "ternary_conv_cuda.cu"} <= names
    assert {"int4_cuda_ops.cpp", "ternary_conv_cuda_ops.cpp"} <= names


@pytest.mark.parametrize("source", UNITS, ids=[p.relative_to(CSRC).as_posix() for p in UNITS])
def test_cuda_unit_compiles(compiled, source):
    out, result = compiled[source]
    assert result.returncode == 0, f"{source.name}:\n{result.stderr[-4000:]}"
    assert out.stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump") or (str(CUDA_HOME / "bin" / "cuobjdump")
                                              if (CUDA_HOME / "bin" / "cuobjdump").exists() else None)
    if source.suffix == ".cu" and cuobjdump:  # Tensor Core instructions really are emitted (make gpu-check lists them)
        listing = subprocess.run([cuobjdump, "-sass", str(out)], capture_output=True, text=True, check=False).stdout
        assert re.search(r"\b(IMMA|HMMA|BMMA)", listing), source.name


def test_cuda_kernels_carry_no_torch_headers():
    """The .cu files stay plain CUDA (fast nvcc; the torch glue lives in the host launchers)."""
    for source in KERNELS:
        assert "#include <torch" not in source.read_text() and "#include <ATen" not in source.read_text(), source


def _defined_ops() -> set[str]:
    names = set()
    for source in CSRC.rglob("*.cpp"):
        names |= set(re.findall(r'm\.def\("(\w+)\(', source.read_text()))
    return names


def test_cuda_registrations_use_the_cpu_op_names():
    """torchao-style dispatch: a CUDA block only adds kernels to ops the CPU files define, never new names."""
    defined = _defined_ops()
    cuda_ops = set()
    for source in LAUNCHERS:
        text = source.read_text()
        block = text[CUDA_BLOCK.search(text).start():]
        cuda_ops |= set(re.findall(r'm\.impl\("(\w+)"', block))
        assert "m.def(" not in block, f"{source.name} defines an op inside its CUDA block"
    assert {"int4_gemm", "int4_gemm_24", "int4_gemm_s4", "w4a16_gemm", "ternary_conv2d", "ternary_conv2d_sign",
            "ternary_prepack", "ternary_conv2d_prepacked", "ternary_conv2d_sign_prepacked"} <= cuda_ops
    assert cuda_ops <= defined, cuda_ops - defined


def _function_body(text: str, name: str) -> str:
    """The brace-balanced body of the C++ function definition `name(` in `text`."""
    match = re.search(rf"\b{name}\([^;{{]*\)\s*{{", text)
    assert match, f"{name} not defined"
    depth, start = 0, match.end() - 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    raise AssertionError(f"unbalanced braces in {name}")


@pytest.mark.parametrize("source, kernels, relayouts", [
    ("binary/ternary_conv.cpp", ["ternary_conv2d_prepacked_cpu", "ternary_conv2d_sign_prepacked_cpu"],
     ["prepack_planes", "prepack_threshold", "ternary_prepack_cpu"]),
    ("binary/ternary_conv_cuda_ops.cpp", ["ternary_conv2d_prepacked_cuda", "ternary_conv2d_sign_prepacked_cuda"],
     ["weight_tiles", "tap_constants", "prepack", "ternary_prepack_cuda"]),
])
def test_prepacked_conv_kernels_never_relayout_weights(source, kernels, relayouts):
    """Issue 24: weights are laid out once, at load (`ternary_prepack`). The per-call kernels, CUDA included (which
    no test here can run), call none of the layout builders; the unit tests check the CPU ones at run time too."""
    text = (CSRC / source).read_text()
    for kernel in kernels:
        body = _function_body(text, kernel)
        called = [f for f in relayouts if re.search(rf"\b{f}\(", body)]
        assert not called, f"{kernel} re-lays its weights per call via {called}"

"""iclrkit: ICLR 2026 techniques as one command-line toolkit. Install with
`pip install --no-build-isolation -e .[dev]` (the C++ extension builds against the installed torch)."""

import glob
import os

from setuptools import find_packages, setup

CORE = ["torch>=2.4", "transformers>=4.45,<6", "accelerate>=0.30", "safetensors", "tokenizers", "typer>=0.12",
        "rich", "pydantic>=2", "pyyaml", "numpy", "scipy", "psutil"]
EXTRAS = {
    "dev": ["pytest", "ruff", "hypothesis"],
    "mesh": ["open3d-cpu"],
    "scip": ["pyscipopt"],
    "llm": ["openai", "bm25s", "faiss-cpu"],
    "quant": ["bitsandbytes", "gguf", "compressed-tensors"],
    "eval": ["lm-eval"],
    "sci": ["numba", "scikit-learn", "matplotlib", "pillow"],
    "video": ["av"],
    # the OBR peer; it pins transformers 5.17, so examples/obr/repro.sh installs it into its own .venv-bench
    "bench": ["llmcompressor"],
}
EXTRAS["all"] = sorted({p for name, pkgs in EXTRAS.items() if name not in ("dev", "bench") for p in pkgs})


def extensions():
    """toolkit._C: CPU kernels always; CUDA kernels when torch has CUDA, CUDA_HOME is set and not disabled.

    Built with ninja, one compiler process per source in parallel (MAX_JOBS caps them; torch's BuildExtension reads
    it). CUDA architectures come from TORCH_CUDA_ARCH_LIST (default: the visible GPUs), e.g. "8.0;9.0"."""
    if os.environ.get("ICLRKIT_SKIP_EXT") == "1":  # the Makefile's editable install: its own build_ext step
        return [], {}                               # builds the extension and fails loudly with the compiler log
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
    except ImportError:
        return [], {}
    sources = ["csrc/module.cpp"] + sorted(glob.glob("csrc/**/*.cpp", recursive=True))
    sources = list(dict.fromkeys(sources))
    openmp = ["-fopenmp"]
    cxx = ["-O3", "-std=c++17", *openmp]
    cuda_sources = sorted(glob.glob("csrc/**/*.cu", recursive=True))
    build_cuda = (os.environ.get("ICLRKIT_BUILD_CUDA", "1") != "0" and torch.version.cuda is not None
                  and CUDA_HOME is not None and cuda_sources)
    if build_cuda:
        ext = CUDAExtension("toolkit._C", sources + cuda_sources, define_macros=[("ICLRKIT_WITH_CUDA", None)],
                            extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-std=c++17", "--expt-relaxed-constexpr"]},
                            extra_link_args=openmp)
    else:
        ext = CppExtension("toolkit._C", sources, extra_compile_args=cxx, extra_link_args=openmp)
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = extensions()

setup(
    name="iclrkit",
    version="0.1.0",
    description="ICLR 2026 techniques as command-line tools for your own models and data",
    long_description=open("README.md").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["cli", "cli.*", "toolkit", "toolkit.*"]),
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["iclrkit = cli.main:main"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    include_package_data=True,
)

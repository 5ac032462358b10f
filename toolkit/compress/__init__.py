"""Joint quantization + sparsification of LLMs: OBR and the baselines it is compared against (RTN, GPTQ,
SparseGPT, Wanda), sharing one sequential pipeline, one set of quantizers and one packed export format."""

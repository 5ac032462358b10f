"""`load_llm(spec)`: the backend for a spec — an OpenAI-compatible server or a local Hugging Face model. Apart from
base.py (the interface and result types) so the backends, which implement the interface, are not imported by it."""

from __future__ import annotations

from toolkit.core.errors import BadInputError
from toolkit.llm.base import LLM


def load_llm(spec: str, device: str = "cpu", dtype=None, cache_dir: str | None = None, timeout: float = 60.0,
             concurrency: int = 1) -> LLM:
    """`openai:MODEL@http://host:port/v1` (any OpenAI-compatible server; key from OPENAI_API_KEY) or a model spec
    for a local Hugging Face model (path, hub id, zoo:NAME). `concurrency`: requests a server backend keeps in
    flight (a command passes its config's `concurrency`); local models ignore it."""
    if not spec:
        raise BadInputError("empty LLM spec")
    if spec.startswith("openai:"):
        from toolkit.llm.openai_backend import OpenAIBackend

        model, _, base_url = spec[len("openai:"):].partition("@")
        if not model or not base_url:
            raise BadInputError(f"bad LLM spec '{spec}'", "use openai:MODEL@http://host:port/v1")
        return OpenAIBackend(model=model, base_url=base_url, cache_dir=cache_dir, timeout=timeout,
                             concurrency=concurrency)
    from toolkit.llm.hf import HFBackend

    return HFBackend(spec, device=device, dtype=dtype)

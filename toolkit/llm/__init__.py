"""LLM backends behind one interface: local Hugging Face models and any OpenAI-compatible server."""

from toolkit.llm.base import LLM, Completion, ScoredText
from toolkit.llm.load import load_llm

__all__ = ["LLM", "Completion", "ScoredText", "load_llm"]

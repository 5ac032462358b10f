"""The config knob every LLM-backed command shares, declared once: `class XConfig(LLMClientConfig)`.

Torch-free (the CLI builds options from it). The command's run() passes `config.concurrency` to `load_llm`, so the
value reaches the backends it loads and nothing else: no process-wide setting is changed."""

from __future__ import annotations

from pydantic import Field

from toolkit.core.config import BaseConfig


class LLMClientConfig(BaseConfig):
    concurrency: int = Field(1, ge=1, description="Requests kept in flight to an OpenAI-compatible server "
                                                  "(openai:...); results stay in input order and equal those of "
                                                  "--concurrency 1. Local models run one request at a time.")

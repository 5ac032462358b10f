"""Any OpenAI-compatible server (vLLM, llama.cpp, the loopback test server): timeouts, retries and a disk cache
keyed by the request, so re-running a recipe does not re-query the server."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from toolkit.core.errors import ResourceError
from toolkit.llm.base import LLM, Completion, ScoredText


class OpenAIBackend(LLM):
    capabilities = frozenset({"generate", "score", "token_logprobs"})

    def __init__(self, model: str, base_url: str, cache_dir: str | None = None, timeout: float = 60.0,
                 retries: int = 3, api_key: str | None = None):
        try:
            import openai
        except ImportError:
            raise ResourceError("the OpenAI-compatible backend needs the 'openai' package",
                                "pip install iclrkit[llm]") from None
        self.model, self.name = model, f"openai:{model}@{base_url}"
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY", "none"),
                                    timeout=timeout, max_retries=0)
        self.retries = retries
        self.cache = Path(cache_dir) if cache_dir else None
        self._errors = (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError,
                        openai.RateLimitError)

    def _call(self, kind: str, request: dict[str, Any]) -> dict[str, Any]:
        key = hashlib.sha256(json.dumps([kind, self.model, request], sort_keys=True).encode()).hexdigest()
        cached = self.cache / f"{key}.json" if self.cache else None
        if cached is not None and cached.exists():
            return json.loads(cached.read_text())
        endpoint = self.client.chat.completions if kind == "chat" else self.client.completions
        for attempt in range(self.retries + 1):
            try:
                response = endpoint.create(model=self.model, **request).model_dump()
                break
            except self._errors as exc:
                if attempt == self.retries:
                    raise ResourceError(f"LLM server {self.name} failed after {attempt + 1} tries: "
                                        f"{type(exc).__name__}") from None
                time.sleep(min(2 ** attempt * 0.5, 8))
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(response))
        return response

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0,
                 stop: Sequence[str] | None = None, seed: int = 0, chat: bool = False) -> list[Completion]:
        results = []
        for prompt in prompts:
            common = {"max_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                      **({"stop": list(stop)} if stop else {})}
            if chat:
                results.append(self.chat([{"role": "user", "content": prompt}], max_new_tokens, temperature, stop,
                                         seed))
            else:
                choice = self._call("completion", {"prompt": prompt, "logprobs": 1, **common})["choices"][0]
                logprobs = choice.get("logprobs") or {}
                results.append(Completion(text=choice["text"], token_logprobs=logprobs.get("token_logprobs") or [],
                                          tokens=logprobs.get("tokens") or [],
                                          finish_reason=choice.get("finish_reason") or "stop"))
        return results

    def chat(self, messages: list[dict[str, Any]], max_new_tokens: int = 64, temperature: float = 0.0,
             stop: Sequence[str] | None = None, seed: int = 0) -> Completion:
        """One chat completion for OpenAI-format messages (content may hold image_url parts for vision models),
        through the same cache and retries as every other request."""
        request = {"messages": messages, "max_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                   **({"stop": list(stop)} if stop else {})}
        choice = self._call("chat", request)["choices"][0]
        return Completion(text=choice["message"]["content"] or "", finish_reason=choice.get("finish_reason") or "stop")

    def score(self, prompts: Sequence[str], continuations: Sequence[str], chat: bool = False) -> list[ScoredText]:
        """Echo the prompt+continuation with max_tokens=0 and keep the tokens whose text offset falls in the
        continuation (the vLLM/OpenAI legacy-completions way of scoring supplied text). Chat endpoints return no
        log-probs of supplied text and the client does not know the server's chat template, so chat=True fails."""
        self.require("chat_score" if chat else "score", "scoring supplied text in chat format" if chat
                     else "scoring supplied text")
        scored = []
        for prompt, continuation in zip(prompts, continuations, strict=True):
            response = self._call("completion", {"prompt": prompt + continuation, "max_tokens": 0, "echo": True,
                                                 "logprobs": 1, "temperature": 0.0})
            logprobs = response["choices"][0].get("logprobs")
            if not logprobs or not logprobs.get("token_logprobs"):
                raise ResourceError(f"server {self.name} returned no prompt log-probs (echo + logprobs)",
                                    "use a server that supports echo=True with logprobs, e.g. vLLM")
            offsets = logprobs["text_offset"]
            keep = [i for i, offset in enumerate(offsets) if offset >= len(prompt)
                    and logprobs["token_logprobs"][i] is not None]
            values = [logprobs["token_logprobs"][i] for i in keep]
            scored.append(ScoredText(logprob=float(sum(values)), token_logprobs=values,
                                     tokens=[logprobs["tokens"][i] for i in keep]))
        return scored

"""Any OpenAI-compatible server (vLLM, llama.cpp, the loopback test server): timeouts, the openai client's own retries
(`max_retries`: backoff on connection errors, 408/409/429 and 5xx), a bounded pool of concurrent requests (results in
input order), and a disk cache keyed by the request, so re-running a recipe does not re-query the server."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from toolkit.core.errors import BadInputError, ResourceError
from toolkit.llm.base import LLM, Completion, ScoredText
from toolkit.llm.pool import ordered_map

DEFAULT_CONCURRENCY = 1


def check_concurrency(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"concurrency must be a whole number >= 1, got {value!r}")
    return value


class OpenAIBackend(LLM):
    capabilities = frozenset({"generate", "score", "token_logprobs"})

    def __init__(self, model: str, base_url: str, cache_dir: str | None = None, timeout: float = 60.0,
                 retries: int = 3, api_key: str | None = None, concurrency: int = DEFAULT_CONCURRENCY):
        try:
            import openai
        except ImportError:
            raise ResourceError("the OpenAI-compatible backend needs the 'openai' package",
                                "pip install iclrkit[llm]") from None
        self.model, self.name = model, f"openai:{model}@{base_url}"
        self.concurrency = check_concurrency(concurrency)
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY", "none"),
                                    timeout=timeout, max_retries=retries)
        self.cache = Path(cache_dir) if cache_dir else None
        self._openai = openai
        self._errors = (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError,
                        openai.RateLimitError)

    @property
    def retries(self) -> int:
        return self.client.max_retries

    @retries.setter
    def retries(self, value: int) -> None:
        self.client = self.client.with_options(max_retries=value)

    def _map(self, function: Callable, items: Sequence) -> list:
        """function over items, at most `concurrency` requests in flight; results in input order."""
        return list(ordered_map(function, items, self.concurrency))

    def _call(self, kind: str, request: dict[str, Any]) -> dict[str, Any]:
        key = hashlib.sha256(json.dumps([kind, self.model, request], sort_keys=True).encode()).hexdigest()
        cached = self.cache / f"{key}.json" if self.cache else None
        if cached is not None and cached.exists():
            return json.loads(cached.read_text())
        endpoint = self.client.chat.completions if kind == "chat" else self.client.completions
        try:
            response = endpoint.create(model=self.model, **request).model_dump()
        except self._errors as exc:
            if request.get("echo") and "echo" in _message(exc).lower():  # servers answering the refusal with a 5xx
                raise _refused_echo(self.name, exc) from None
            raise ResourceError(f"LLM server {self.name} failed after {self.retries + 1} tries: "
                                f"{type(exc).__name__}") from None
        except self._openai.BadRequestError as exc:
            if request.get("echo"):
                raise _refused_echo(self.name, exc) from None
            raise ResourceError(f"LLM server {self.name} refused the request: {_message(exc)}") from None
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            partial.write_text(json.dumps(response))
            partial.replace(cached)  # concurrent writers of one key never leave a torn file
        return response

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0,
                 stop: Sequence[str] | None = None, seed: int = 0, chat: bool = False) -> list[Completion]:
        common = {"max_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                  **({"stop": list(stop)} if stop else {})}

        def one(prompt: str) -> Completion:
            if chat:
                return self.chat([{"role": "user", "content": prompt}], max_new_tokens, temperature, stop, seed)
            choice = self._call("completion", {"prompt": prompt, "logprobs": 1, **common})["choices"][0]
            logprobs = choice.get("logprobs") or {}
            return Completion(text=choice["text"], token_logprobs=logprobs.get("token_logprobs") or [],
                              tokens=logprobs.get("tokens") or [], finish_reason=choice.get("finish_reason") or "stop")

        return self._map(one, list(prompts))

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
        log-probs of supplied text and the client does not know the server's chat template, so chat=True fails;
        so does a server that refuses echo (llama.cpp's), with an error naming that limitation (exit 3)."""
        self.require("chat_score" if chat else "score", "scoring supplied text in chat format" if chat
                     else "scoring supplied text")
        pairs = list(zip(prompts, continuations, strict=True))

        def one(pair: tuple[str, str]) -> ScoredText:
            prompt, continuation = pair
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
            return ScoredText(logprob=float(sum(values)), token_logprobs=values,
                              tokens=[logprobs["tokens"][i] for i in keep])

        return self._map(one, pairs)


def _message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return body["message"]
    return str(exc).splitlines()[0][:200]


def _refused_echo(name: str, exc) -> ResourceError:
    message = _message(exc)
    llama_cpp = "no echo" in message.lower()
    what = ("llama.cpp's server rejects echo and returns no log-probs of prompt tokens" if llama_cpp
            else "the server rejected echo=True with logprobs")
    return ResourceError(f"server {name} cannot score supplied text: {what} (it answered: {message!r})",
                         "score with a server that echoes prompt log-probs (vLLM: --max-logprobs) or a local model "
                         "(-m PATH); llama.cpp's /completion n_probs covers generated tokens only")

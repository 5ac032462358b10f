"""A tiny loopback OpenAI-compatible server for tests and offline demos: /v1/models, /v1/completions (with
logprobs and echo) and /v1/chat/completions, answering from a script or from a local HF backend.

It binds 127.0.0.1 only and serves until `stop()`. For tests of clients it counts the requests in flight
(`max_in_flight`), can hold each request until `gate` of them are in flight at once (so a concurrent client shows its
concurrency without timing luck; a sequential one is released after `gate_timeout`), and with `refuse_echo` answers
echo requests as llama.cpp's server does (HTTP 400 "Only no echo is supported").
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

Reply = Callable[[str], str]


class LoopbackServer:
    """`with LoopbackServer(reply=fn) as url:` or `LoopbackServer(backend=HFBackend(...))`.

    A scripted `reply(prompt) -> text` serves generation; scoring needs a backend (it reports real log-probs)."""

    def __init__(self, reply: Reply | None = None, backend=None, model_name: str = "loopback",
                 refuse_echo: bool = False, gate: int = 0, gate_timeout: float = 10.0):
        if reply is None and backend is None:
            raise ValueError("give a scripted reply function or a backend")
        self.reply, self.backend, self.model_name = reply, backend, model_name
        self.refuse_echo, self.gate, self.gate_timeout = refuse_echo, gate, gate_timeout
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._gate_open = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _complete(self, body: dict) -> dict:
        prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
        if body.get("echo") and body.get("max_tokens", 16) == 0:
            return self._echo(prompt)
        if self.reply is not None:
            text = self.reply(prompt)
            logprobs = {"tokens": [text], "token_logprobs": [0.0], "text_offset": [len(prompt)]}
        else:
            completion = self.backend.generate([prompt], max_new_tokens=body.get("max_tokens", 16),
                                               temperature=body.get("temperature") or 0.0,
                                               stop=body.get("stop"), seed=body.get("seed") or 0)[0]
            text = completion.text
            logprobs = {"tokens": completion.tokens, "token_logprobs": completion.token_logprobs,
                        "text_offset": [len(prompt)] * len(completion.tokens)}
        return {"id": "cmpl-loopback", "object": "text_completion", "model": self.model_name,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                             "logprobs": logprobs if body.get("logprobs") is not None else None}]}

    def _echo(self, text: str) -> dict:
        if self.backend is None:
            logprobs = None
        else:
            tokenizer = self.backend.tokenizer
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            scored = self.backend.score([""], [text])[0]
            offsets = [start for start, _ in encoded["offset_mapping"]]
            logprobs = {"tokens": [tokenizer.decode([t]) for t in encoded["input_ids"]],
                        "token_logprobs": [None] + scored.token_logprobs, "text_offset": offsets}
        return {"id": "cmpl-loopback", "object": "text_completion", "model": self.model_name,
                "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": logprobs}]}

    def _chat(self, body: dict) -> dict:
        prompt = body["messages"][-1]["content"]
        if isinstance(prompt, list):  # vision-style content parts: keep the text parts
            prompt = "\n".join(part.get("text", "") for part in prompt if part.get("type") == "text")
        if self.reply is not None:
            text = self.reply(prompt)
        else:
            text = self.backend.generate([prompt], max_new_tokens=body.get("max_tokens") or 64, chat=True,
                                         stop=body.get("stop"))[0].text
        return {"id": "chat-loopback", "object": "chat.completion", "model": self.model_name,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}]}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, **body})
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    if server.in_flight >= server.gate:
                        server._gate_open.set()
                try:
                    if server.gate > 1:
                        server._gate_open.wait(server.gate_timeout)
                    code, payload = self._answer(body)
                finally:  # before the reply is sent: the client may send its next request as soon as it has it
                    with server._lock:
                        server.in_flight -= 1
                self._send(code, payload)

            def _answer(self, body: dict) -> tuple[int, dict]:
                if server.refuse_echo and body.get("echo"):
                    return 400, {"error": {"code": 400, "message": "Only no echo is supported",
                                           "type": "invalid_request_error"}}
                if self.path.endswith("/chat/completions"):
                    return 200, server._chat(body)
                if self.path.endswith("/completions"):
                    return 200, server._complete(body)
                return 404, {"error": {"message": "not found"}}

        return Handler

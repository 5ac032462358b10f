"""Final answers of math reasoning (GSM8K, MATH, MetaMath styles) and the one math-equivalence entry point.

Final answer (the paper's protocol, our own thin layer): the last `\\boxed{…}` (or `\\fbox{…}`), else the text after
the last "The answer is" (with or without a colon), else the text after "####" (GSM8K); a model's free-form response
falls back to its last number, a reference answer field without any marker is taken whole when it is one line
(MATH-500's bare `answer`).

Equivalence: `equivalent(prediction, reference)`, Hugging Face's math-verify (LaTeX and plain expressions, sets,
intervals, matrices, equations) with the rules of `toolkit.uq.math_judge` (integers and fractions exact; a tolerance
only when the reference is a decimal; base-n numerals). Each judgement runs in a worker process that is killed past
`timeout_s` (math-verify's own SIGALRM timeouts work only in a main thread): a judgement that does not finish in
time is "not equal" and counted in the caller's `JudgeStats`, so the judge is safe from any thread.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?", re.IGNORECASE)


# ------------------------------------------------------------------------------------------ extraction
def _braced(text: str, start: int) -> tuple[str, int] | None:
    """(content, index after the closing brace) of the brace group opening at text[start] == "{"."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{…} / \\fbox{…} (or `\\boxed 5`), None when there is none or it is unclosed."""
    at = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if at < 0:
        return None
    rest = at + (6 if text.startswith("\\boxed", at) else 5)
    while rest < len(text) and text[rest] == " " and (rest + 1 >= len(text) or text[rest + 1] == "{"):
        rest += 1
    if rest < len(text) and text[rest] == "{":
        group = _braced(text, rest)
        return group[0].strip() if group else None
    if rest < len(text) and text[rest] == " ":
        token = text[rest:].split()
        return token[0].rstrip(".$") if token else None
    return None


def marked_final(text: str) -> str | None:
    """The answer behind a marker (\\boxed{…}, "The answer is …", "#### …"), or None without one: the strict
    reading of a response, with no last-number fallback."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = list(_ANSWER_IS.finditer(text))
    if found:
        tail = text[found[-1].end():].strip().split("\n")[0].strip()
        tail = tail[:-1].rstrip() if tail.endswith(".") else tail
        if tail:
            return tail.strip("$ ")
    if "####" in text:
        tail = text.split("####")[-1].strip().split("\n")[0].strip()
        if tail:
            return tail
    return None


def predicted_final(text: str) -> str | None:
    """A model response's final answer: a marked one, else its last number (GSM8K style), else None."""
    marked = marked_final(text)
    if marked is not None:
        return marked
    numbers = _NUMBER.findall(text)
    return numbers[-1].rstrip(",") if numbers else None  # "…which is 20, since…" -> "20"


def reference_final(text: str) -> str | None:
    """A reference answer field's final answer: a marked one, else the whole field when it is one line."""
    marked = marked_final(text)
    if marked is not None:
        return marked
    text = text.strip()
    return text if text and "\n" not in text else None


# ------------------------------------------------------------------------------------------ equivalence
TIMEOUT_S = 10.0  # wall seconds per judgement (parsing both answers and comparing them)
STARTUP_S = 300.0  # the worker's start: importing sympy and math-verify, one warm-up judgement


@dataclass
class JudgeStats:
    """Counts over the judgements of one run: `timeouts` were cut at the time limit (judged not equal);
    `unparsed` had an answer math-verify could not read as mathematics (judged by its text comparison)."""

    judged: int = 0
    timeouts: int = 0
    unparsed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class _Worker:
    """One `python -m toolkit.uq.math_judge` process, started on first use and again after it is killed; one
    judgement at a time (a lock), so any thread may call it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue | None = None
        self.pid = os.getpid()

    def _start(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "toolkit.uq.math_judge"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                     env=env)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()
        ready = self._answer(STARTUP_S)
        if ready is None or not ready.get("ready"):
            self.stop()
            from toolkit.core.errors import ResourceError

            raise ResourceError("the math-answer judge (python -m toolkit.uq.math_judge) did not start",
                                "is math-verify installed? pip install 'math-verify[antlr4_13_2]'")

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def _answer(self, timeout_s: float) -> dict | None:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return json.loads(line) if line else None

    def stop(self) -> None:
        if self.proc is not None and os.getpid() == self.pid:
            self.proc.kill()
            self.proc.wait()
        self.proc, self.lines = None, None

    def ask(self, prediction: str, reference: str, timeout_s: float) -> dict | None:
        """The worker's verdict, or None when it did not answer within timeout_s (the worker is then killed)."""
        with self.lock:
            if os.getpid() != self.pid:  # a forked child: the parent's worker is not ours
                self.proc, self.lines, self.pid = None, None, os.getpid()
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                self.proc.stdin.write(json.dumps({"p": prediction, "r": reference}) + "\n")
                self.proc.stdin.flush()
            except OSError:
                self.stop()
                return None
            verdict = self._answer(timeout_s)
            if verdict is None:
                self.stop()
            return verdict


_WORKER = _Worker()
atexit.register(_WORKER.stop)
_CACHE: dict[tuple[str, str], dict] = {}


def equivalent(prediction: str | None, reference: str | None, stats: JudgeStats | None = None,
               timeout_s: float | None = None) -> bool:
    """Whether the prediction is the reference's answer (module docstring; rules in toolkit.uq.math_judge). Not
    symmetric in one respect: a decimal prediction is held to exactness unless the reference is itself a decimal.
    A judgement that takes longer than timeout_s (default TIMEOUT_S) is False and counted in stats.timeouts."""
    if stats is not None:
        stats.judged += 1
    if prediction is None or reference is None:
        return False
    key = (prediction, reference)
    verdict = _CACHE.get(key)
    if verdict is None:
        verdict = _WORKER.ask(prediction, reference, TIMEOUT_S if timeout_s is None else timeout_s)
        if verdict is None:
            if stats is not None:
                stats.timeouts += 1
            return False
        if len(_CACHE) < 100_000:
            _CACHE[key] = verdict
    if stats is not None and not verdict["parsed"]:
        stats.unparsed += 1
    return bool(verdict["equal"])

"""Math-answer equivalence on Hugging Face's math-verify, with the few rules of our own it lacks.

`judge(prediction, reference)` runs in the process that calls it, with no time limit: `toolkit.uq.math_answer.
equivalent` calls it in a worker process that it kills past a per-judgement limit (math-verify's own timeouts use
SIGALRM, which only works in a process's main thread). Run as a module (`python -m toolkit.uq.math_judge`), it is
that worker: {"ready": true} on stdout once loaded, then one JSON request per line on stdin ({"p": prediction,
"r": reference}) and one JSON verdict per line on stdout ({"equal": bool, "parsed": bool}).

Rules (math-verify's `parse` on `\\boxed{answer}` and `verify(gold=reference, target=prediction)`, plus):
- Integers and fractions compare exactly. A decimal in the prediction is read as the exact rational it writes
  (0.333333 = 333333/10⁶) unless the reference itself holds a decimal; only then does math-verify's float rounding
  (6 decimal places) apply. So `0.333333` is not `\\frac13`, but against the reference `0.333333` the prediction
  `\\frac13` is accepted (the reference's own precision).
- Base-n numerals (`52_8`, `4210_{5}`, `1011_{(2)}`): equal only to a numeral of the same base and value (leading
  zeros aside); never to the decimal that spells the same digits (`52_8` ≠ 528) nor to a bare decimal of the same
  value (`52_8` ≠ 42: a question asking for base 8 wants base 8); base 10 is a plain number. math-verify drops the
  subscript (it reads `52_8` as 52), so an answer with a subscripted number inside a larger expression is compared as
  text only (spaces, `$`, `\\text` aside).
- A trailing period is dropped (`18.` = 18); thin-space thousands (`1\\,000\\,000`) are joined; a number followed by
  plain words is that number (`18 dollars` = 18; math-verify itself strips LaTeX units such as `\\mbox{ inches}^2`).
- One `\\pm` inside an expression is expanded into the two answers it writes (math-verify reads a top-level one).
"""

from __future__ import annotations

import json
import logging
import re
import sys

_BASE_N = re.compile(r"(?:\\(?:text|mathrm)\{)?([0-9A-Za-z]+)\}?\s*_\s*\{?\s*\(?\s*(\d+)\s*\)?\s*\}?")
_SUBSCRIPTED_NUMBER = re.compile(r"(?<![A-Za-z\\])\d[0-9A-Za-z]*\}?\s*_\s*\{?\s*\(?\s*\d")  # not x_1


_PLAIN_UNIT = re.compile(r"(-?[\d.,]+)\s+(?:[a-zA-Z]{2,}\.?\s*)+")


def _clean(answer: str) -> str:
    s = answer.strip().replace("\n", " ")
    s = re.sub(r"(?<!\.)\.\s*$", "", s).strip()  # "18." → "18" (not "…")
    if s.count("$") == 2 and s.startswith("$") and s.endswith("$"):
        s = s[1:-1].strip()
    while re.search(r"\d\\[,!:; ]\s*\d{3}(?!\d)", s):  # "1\,000\,000" → "1000000"
        s = re.sub(r"(\d)\\[,!:; ]\s*(\d{3})(?!\d)", r"\1\2", s)
    unit = _PLAIN_UNIT.fullmatch(s)  # "18 dollars", "5 apples": a number and plain words after it
    if unit and unit.group(0)[len(unit.group(1)):].strip(". ").lower() != "pi":
        s = unit.group(1)
    return _expand_pm(s)


def _expand_pm(s: str) -> str:
    """One `\\pm` (or `\\mp`) anywhere, and no comma: the two answers it writes, as a list (math-verify reads `\\pm`
    only at the top level: `\\frac{-1\\pm\\sqrt5}{2}`)."""
    signs = re.findall(r"\\(pm|mp)(?![a-zA-Z])", s)
    if len(signs) != 1 or "," in s:
        return s
    first, second = ("+", "-") if signs[0] == "pm" else ("-", "+")
    at = re.search(r"\\(?:pm|mp)(?![a-zA-Z])", s)
    return f"{s[:at.start()]}{first}{s[at.end():]}, {s[:at.start()]}{second}{s[at.end():]}"


def _text(answer: str) -> str:
    """Text comparison key: no spaces, `$`, `\\text{}`/`\\mathrm{}` wrappers or spacing commands; case folded."""
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", answer)
    s = re.sub(r"\\[!,;: ]", "", s).replace("$", "").replace("\\", "")
    return re.sub(r"\s+", "", s).lower()


def _base_n(answer: str) -> tuple[int, int] | None:
    """(value, base) of an answer that is one base-n numeral (base 2–36, digits valid for it), else None."""
    match = _BASE_N.fullmatch(answer.strip())
    if not match:
        return None
    digits, base = match.group(1), int(match.group(2))
    if not 2 <= base <= 36:
        return None
    try:
        return int(digits, base), base
    except ValueError:
        return None


def _parse(answer: str) -> list:
    from math_verify import LatexExtractionConfig, parse

    return parse("\\boxed{" + answer + "}", extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
                 parsing_timeout=None)


def _has_decimal(parsed: list) -> bool:
    from sympy import Basic, Float
    from sympy.matrices import MatrixBase

    return any(isinstance(p, (Basic, MatrixBase)) and bool(p.atoms(Float)) for p in parsed)


def _exact_decimals(parsed: list) -> list:
    """Each decimal (sympy Float) replaced by the rational its digits write."""
    from sympy import Basic, Float, Rational
    from sympy.matrices import MatrixBase

    out = []
    for p in parsed:
        if isinstance(p, (Basic, MatrixBase)):
            try:
                p = p.xreplace({f: Rational(str(f)) for f in p.atoms(Float)})
            except Exception:  # noqa: BLE001 - an object sympy cannot rebuild: judged without it
                continue
        out.append(p)
    return out


def judge(prediction: str, reference: str) -> dict:
    """{"equal": whether the prediction is the reference's answer, "parsed": whether both parsed into mathematics
    (else the verdict is math-verify's text comparison)}. No time limit: see the module docstring."""
    from sympy import Basic
    from sympy.matrices import MatrixBase

    p, r = _clean(prediction), _clean(reference)
    if not p or not r:
        return {"equal": False, "parsed": False}
    p_base, r_base = _base_n(p), _base_n(r)
    if p_base and p_base[1] == 10:
        p, p_base = str(p_base[0]), None
    if r_base and r_base[1] == 10:
        r, r_base = str(r_base[0]), None
    if p_base or r_base:
        return {"equal": p_base == r_base, "parsed": True}
    if _SUBSCRIPTED_NUMBER.search(p) or _SUBSCRIPTED_NUMBER.search(r):
        return {"equal": _text(p) == _text(r), "parsed": False}
    from math_verify import verify

    gold, target = _parse(r), _parse(p)
    parsed = (any(isinstance(g, (Basic, MatrixBase)) for g in gold)
              and any(isinstance(t, (Basic, MatrixBase)) for t in target))
    if not _has_decimal(gold):
        target = _exact_decimals(target)
    return {"equal": bool(verify(gold, target, timeout_seconds=None)), "parsed": parsed}


def main() -> None:
    """The worker loop (module docstring)."""
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    judge("\\frac{1}{2}", "0.5")  # imports and the LaTeX grammar load before the first timed judgement
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            verdict = judge(request["p"], request["r"])
        except Exception:  # noqa: BLE001 - a judgement that fails is "not equal", never the end of the worker
            verdict = {"equal": False, "parsed": False}
        sys.stdout.write(json.dumps(verdict) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

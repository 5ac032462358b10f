"""Final answers of math reasoning (GSM8K, MATH, MetaMath styles) and a math-equivalence check.

Final answer: the last `\\boxed{…}` (or `\\fbox{…}`), else the text after the last "The answer is" (with or without a
colon), else the text after "####"; a model's free-form response falls back to its last number, a reference
answer field without any marker is taken whole when it is one line (MATH-500's bare `answer`).

Equivalence (after `normalize`: no `$`, `\\left`/`\\right`, spacing commands, `\\text{}` wrappers, degree and
percent signs, trailing units and periods; `\\dfrac`/`\\tfrac` → `\\frac`, `\\frac12` → `\\frac{1}{2}`, `a/b` →
`\\frac{a}{b}`, thousands separators dropped): equal strings; equal numbers (fractions against decimals, relative
1e-6); tuples/intervals element by element with the same brackets; bare comma lists as multisets; otherwise sympy on
a small LaTeX → sympy translation, where it parses: a − b simplifies to 0, or both are numbers equal to 1e-6.
"""

from __future__ import annotations

import math
import re

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


# ------------------------------------------------------------------------------------------ normalisation
_WRAPPERS = ("\\text", "\\textbf", "\\textit", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox", "\\textnormal",
             "\\operatorname")


def _unwrap(text: str, command: str) -> str:
    """`\\command{x}` → `x` for every occurrence (nested braces kept balanced)."""
    out, i = [], 0
    while True:
        at = text.find(command + "{", i)
        if at < 0:
            return "".join(out) + text[i:]
        group = _braced(text, at + len(command))
        if group is None:
            return "".join(out) + text[i:]
        out.append(text[i:at] + group[0])
        i = group[1]


def _fix_fracs(text: str) -> str:
    """`\\frac12` → `\\frac{1}{2}`, `\\frac1{b}` → `\\frac{1}{b}`, `\\frac{a}2` → `\\frac{a}{2}`."""
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\s*([0-9a-zA-Z])\s*\{", r"\\frac{\1}{", text)
    return re.sub(r"\\frac\{([^{}]*)\}\s*([0-9a-zA-Z])", r"\\frac{\1}{\2}", text)


def normalize(answer: str) -> str:
    """Canonical text of a final answer (module docstring); spaces removed at the end."""
    s = answer.strip().replace("\n", " ")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right)\s*\.", "", s)  # invisible delimiters
    s = re.sub(r"\\(?:left|right|bigg|Bigg|big|Big)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[!,;: ]", " ", s).replace("~", " ").replace("\\displaystyle", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for command in _WRAPPERS:
        s = _unwrap(s, command)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("°", "").replace("\\degree", "")
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\\sqrt\s*(\d|[a-zA-Z])", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    s = s.strip().rstrip(".").strip()
    # a trailing unit after a plain number: "5 cm", "10 inches", "12 dollars" (a word of two or more letters)
    unit = re.fullmatch(r"(-?[\d.,]+|\\frac\{\d+\}\{\d+\})\s+([a-zA-Z]{2,}\.?\s*)+", s)
    if unit and unit.group(2).strip(". ").lower() not in {"pi"}:
        s = unit.group(1)
    s = re.sub(r"^[a-zA-Z]\s*=\s*(?=[^=]+$)", "", s)  # "x = 5" → "5" (one assignment only)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s.replace(" ", "")):
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)  # ".5" → "0.5"
    s = s.replace(" ", "")
    slash = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if slash:
        s = f"\\frac{{{slash.group(1)}}}{{{slash.group(2)}}}"
    return s


# ------------------------------------------------------------------------------------------ equivalence
def _number(s: str) -> float | None:
    """A plain number, `\\frac{a}{b}` or `-\\frac{a}{b}` of plain numbers, else None."""
    try:
        return float(s)
    except ValueError:
        pass
    frac = re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    if frac:
        try:
            value = float(frac.group(2)) / float(frac.group(3))
        except (ValueError, ZeroDivisionError):
            return None
        return -value if frac.group(1) else value
    return None


def _split_top(s: str) -> list[str]:
    """Split at commas outside any bracket."""
    parts, depth, current = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + [current]


_LATEX_TO_SYMPY = [(r"\\pi(?![a-zA-Z])", " pi "), (r"\\infty", " oo "), (r"\\cdot|\\times", "*"), (r"\\div", "/"),
                   (r"\\ln(?![a-zA-Z])", "log"), (r"\\log(?![a-zA-Z])", "log"), (r"\\(sin|cos|tan|exp)", r"\1")]


def _latex_to_sympy_text(s: str) -> str | None:
    """A small LaTeX → sympy-syntax translation (fractions, roots, powers, π, ∞, products); None when commands
    it does not know remain."""
    for _ in range(20):  # innermost first: \frac{a}{b} → ((a)/(b)), \sqrt{a} → sqrt(a), \sqrt[n]{a}
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\[([^{}\[\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", new)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    for pattern, replacement in _LATEX_TO_SYMPY:
        s = re.sub(pattern, replacement, s)
    if "\\" in s:
        return None
    return s.replace("{", "(").replace("}", ")").replace("^", "**")


_SAFE_NAMES = {"sqrt", "pi", "oo", "log", "sin", "cos", "tan", "exp", "E", "I"}


def _safe(text: str) -> bool:
    """parse_expr evaluates Python: allow only arithmetic on numbers, one-letter symbols and a few function names,
    and only small literal (or one-letter) exponents, so that neither code nor 9^(9^9) reaches it."""
    if not re.fullmatch(r"[0-9A-Za-z+\-*/().\s]*", text) or "__" in text:
        return False
    if any(len(name) > 1 and name not in _SAFE_NAMES for name in re.findall(r"[A-Za-z_]+", text)):
        return False
    exponents = re.findall(r"\*\*\s*(\(?[^()]*\)?)", text)
    return all(re.fullmatch(r"\(?\s*-?(\d{1,3}|[A-Za-z]|\d{1,3}\s*/\s*\d{1,3})\s*\)?", e.strip()) for e in exponents)


def _sympy(s: str):
    if len(s) > 200:
        return None
    text = _latex_to_sympy_text(s)
    if text is None or not _safe(text):
        return None
    try:
        from sympy.parsing.sympy_parser import (
            convert_xor,
            implicit_multiplication_application,
            parse_expr,
            standard_transformations,
        )

        return parse_expr(text, transformations=standard_transformations + (implicit_multiplication_application,
                                                                            convert_xor), evaluate=True)
    except Exception:  # noqa: BLE001 — any parse failure means "not parseable", never an error of the caller
        return None


def _sympy_equal(a: str, b: str) -> bool:
    x, y = _sympy(a), _sympy(b)
    if x is None or y is None:
        return False
    try:
        import sympy

        if not x.free_symbols and not y.free_symbols:
            fx, fy = complex(sympy.N(x)), complex(sympy.N(y))
            return abs(fx - fy) <= 1e-6 * max(1.0, abs(fx), abs(fy))
        return sympy.simplify(x - y) == 0
    except Exception:  # noqa: BLE001 — sympy cannot decide: not equivalent
        return False


def _equal_normalized(a: str, b: str) -> bool:
    if a == b:
        return True
    if a.isalpha() and b.isalpha():
        return a.lower() == b.lower()
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)
    if len(a) >= 2 and len(b) >= 2 and a[0] in "([" and b[0] in "([" and a[-1] in ")]" and b[-1] in ")]":
        left, right = _split_top(a[1:-1]), _split_top(b[1:-1])
        if len(left) > 1 or len(right) > 1:  # a tuple or an interval: same brackets, element by element
            return ((a[0], a[-1]) == (b[0], b[-1]) and len(left) == len(right)
                    and all(_equal_normalized(p, q) for p, q in zip(left, right)))
    left, right = _split_top(a), _split_top(b)
    if len(left) > 1 or len(right) > 1:  # a bare list of solutions: the same multiset
        if len(left) != len(right):
            return False
        remaining = list(right)
        for p in left:
            match = next((q for q in remaining if _equal_normalized(p, q)), None)
            if match is None:
                return False
            remaining.remove(match)
        return True
    if "=" in a or "=" in b:
        return False
    return _sympy_equal(a, b)


def equivalent(prediction: str | None, reference: str | None) -> bool:
    """Whether two final answers are the same mathematical answer (module docstring)."""
    if prediction is None or reference is None:
        return False
    return _equal_normalized(normalize(prediction), normalize(reference))

"""The math-answer judge (toolkit.uq.math_answer.equivalent, math-verify underneath) on a table of answer pairs
written for it: for each category, pairs a competent grader accepts and pairs it rejects, each judged in both
directions. The old hand-written judge's false accepts and refusals (issue 46) are marked "old:".

Direction: `equivalent(prediction, reference)`. The judge is symmetric except in one rule, stated in ASYMMETRIC: a
decimal prediction must be exact unless the reference is itself a decimal (then math-verify's 6-decimal rounding
applies), so `0.333333` is not `\\frac13`, while against the reference `0.333333` the prediction `\\frac13` passes.
"""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.uq.math_answer import JudgeStats, equivalent, predicted_final, reference_final

# (a, b): equivalent(a, b) and equivalent(b, a)
EQUAL = [
    # large integers, thousands separators
    ("1,000,000", "1000000"),
    ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
    ("123,456,789", "123456789"),
    ("1\\,000\\,000", "1000000"),
    ("10^6", "1000000"),
    ("2^{20}", "1048576"),
    ("1000000.0", "1000000"),
    ("\\$1,000,000", "1000000"),
    ("18.", "18"),  # old: equal; a trailing period is punctuation
    ("18.00", "18"),
    ("0018", "18"),
    # base-n numerals
    ("52_8", "52_{8}"),
    ("4210_{5}", "4210_5"),  # old: not equal (unparseable)
    ("1011_2", "1011_{2}"),
    ("0052_8", "52_8"),
    ("A2_{16}", "a2_{16}"),
    ("42_{10}", "42"),
    ("x_1+x_2", "x_2+x_1"),  # a subscripted variable is no base-n numeral
    # polynomials and expressions in another order
    ("x^3+3x-6", "3x+x^3-6"),  # old: not equal (the exponent guard's greedy match)
    ("x^3+3x-6", "-6+3x+x^3"),
    ("x^2+2x+1", "(x+1)^2"),
    ("2x^2-8", "2(x-2)(x+2)"),
    ("a^2-b^2", "(a-b)(a+b)"),
    ("\\frac{x+1}{2}", "\\frac{1}{2}x + \\frac{1}{2}"),
    ("p-q", "-q + p"),
    ("p-q", "p - q"),
    ("2x+3", "3+2x"),
    # vectors and matrices
    ("\\begin{pmatrix} 1 \\\\ \\frac{1}{2} \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 0.5 \\end{pmatrix}"),  # old: no
    ("\\begin{pmatrix} \\frac{2}{3} \\\\ -1 \\end{pmatrix}", "\\begin{pmatrix} 2/3 \\\\ -1 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"),
    ("\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\end{pmatrix}",
     "\\begin{pmatrix} -\\dfrac{1}{3} \\\\ \\dfrac{2}{3} \\end{pmatrix}"),
    ("\\begin{pmatrix} 2 & 0 \\\\ 0 & 2 \\end{pmatrix}", "\\begin{bmatrix} 2 & 0 \\\\ 0 & 2 \\end{bmatrix}"),
    # ±
    ("1\\pm\\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}"),  # old: not equal
    ("1\\pm\\sqrt{19}", "1-\\sqrt{19}, 1+\\sqrt{19}"),
    ("\\pm 3", "3, -3"),
    ("\\frac{-1\\pm\\sqrt{5}}{2}", "\\frac{-1+\\sqrt{5}}{2}, \\frac{-1-\\sqrt{5}}{2}"),
    # interval unions, sets, lists
    ("(-\\infty,-2)\\cup(3,\\infty)", "(3,\\infty)\\cup(-\\infty,-2)"),  # old: not equal
    ("[1,2]\\cup[5,6)", "[5,6)\\cup[1,2]"),
    ("(-\\infty, 0) \\cup (0, \\infty)", "(0,\\infty)\\cup(-\\infty,0)"),
    ("[-2, 7)", "\\left[ -2, 7 \\right)"),
    ("1, -2", "-2, 1"),
    ("\\{1, 2, 3\\}", "\\{3, 2, 1\\}"),
    # membership
    ("x \\in [-2,7]", "[-2,7]"),  # old: not equal
    ("x \\in (0,1]", "(0,1]"),
    # spaces inside commands
    ("\\cot x", "\\cot{x}"),  # old: not equal (\cot x became \cotx)
    ("\\sin x", "\\sin(x)"),
    ("\\tan \\theta", "\\tan(\\theta)"),
    ("\\sec x", "\\frac{1}{\\cos x}"),
    # units
    ("864 \\mbox{ inches}^2", "864"),  # old: not equal
    ("10 \\text{ inches}", "10"),
    ("5 \\text{ cm}", "5"),
    ("5 cm", "5"),
    ("90^\\circ", "90"),
    ("\\$18", "18"),
    ("18 \\text{ dollars}", "18"),
    # equations
    ("y = 2x+3", "y=3+2x"),  # old: not equal
    ("x = 5", "5"),
    ("y = -\\frac{1}{2}x + 4", "y = 4 - 0.5x"),
    ("x^2+y^2=25", "y^2+x^2=25"),
    # roots
    ("\\sqrt[3]{2}", "2^{1/3}"),  # old: not equal
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\sqrt{12}", "2\\sqrt{3}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt[4]{16}", "2"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("2^{1/2}", "\\sqrt{2}"),
    # percent
    ("10\\%", "0.1"),  # old: not equal
    ("10\\%", "10"),
    ("50\\%", "\\frac{1}{2}"),
    ("12.5\\%", "0.125"),
    ("50\\%", "50"),
    # infinity
    ("-\\infty", "-\\infty"),  # old: not equal
    ("-\\infty", "- \\infty"),
    ("\\infty", "+\\infty"),
    # fractions and decimals (exact both ways)
    ("\\frac12", "0.5"),
    ("\\frac{3}{4}", "0.75"),
    ("-\\frac{3}{4}", "-0.75"),
    ("\\frac{1}{8}", "0.125"),
    ("3/2", "1.5"),
    ("\\frac{2}{4}", "\\frac12"),
    ("\\dfrac{7}{2}", "3.5"),
    ("\\dfrac{1}{2}", "\\tfrac{1}{2}"),
    (".5", "\\frac12"),
    ("1/2", "\\tfrac{1}{2}"),
    ("2^{10}", "1024"),
    # constants, tuples, words
    ("\\pi", "\\pi"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("(3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\left( 3, \\dfrac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\text{(B)}", "(B)"),
    ("-7", "-7"),
    ("0", "0"),
]

# (a, b): not equivalent(a, b) and not equivalent(b, a)
DIFFERENT = [
    # large integers differing in one digit: no float tolerance on integers
    ("1000000", "1000001"),  # old: equal (relative tolerance 1e-6)
    ("123456789", "123456790"),  # old: equal
    ("11,\\! 111,\\! 111,\\! 100", "11,\\! 111,\\! 111,\\! 101"),  # old: equal
    ("999999999999", "999999999998"),
    ("10000000000000001", "10000000000000000"),
    ("1,000,000", "1,000,001"),
    ("2^{20}", "1048577"),
    ("1000000.5", "1000000"),
    ("18.0000001", "18"),
    ("17", "18"),
    ("-5", "5"),
    ("1,2", "12"),
    # base-n numerals
    ("52_8", "528"),  # old: equal (float("52_8") == 528.0)
    ("52_8", "52"),
    ("52_8", "42"),  # the same value in base 10: a base-8 question wants base 8
    ("4210_{5}", "4210"),
    ("52_8", "52_9"),
    ("1011_2", "1012_2"),
    ("101_2", "5"),
    ("52_8", "53_8"),
    ("52_8+1", "53"),  # a numeral inside an expression: compared as text (math-verify would drop the base)
    ("x_1", "x_2"),
    # polynomials
    ("x^3+3x-6", "x^3+3x+6"),
    ("x^3+3x-6", "x^3-3x-6"),
    ("x^2+2x+1", "(x-1)^2"),
    ("x^2+1", "y^2+1"),
    ("2x", "2"),  # a variable is not a unit
    ("q - p", "p - q"),
    # vectors and matrices
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 \\\\ \\frac{1}{2} \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ \\frac{1}{3} \\end{pmatrix}"),
    # ±
    ("1\\pm\\sqrt{19}", "1+\\sqrt{19}"),  # one root of two
    ("\\pm 3", "3"),
    ("1\\pm\\sqrt{19}", "1\\pm\\sqrt{17}"),
    # interval unions, sets, lists
    ("(-\\infty,-2]\\cup(3,\\infty)", "(-\\infty,-2)\\cup(3,\\infty)"),
    ("(-\\infty,-2)\\cup(3,\\infty)", "(-\\infty,-2)\\cup(4,\\infty)"),
    ("[-2, 7]", "[-2, 7)"),
    ("[-2,7]", "(-2,7)"),
    ("1, 2", "1, 2, 3"),
    ("(3, \\frac{\\pi}{3})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("(\\frac{\\pi}{2}, 3)", "\\left( 3, \\frac{\\pi}{2} \\right)"),  # an ordered pair is ordered
    # membership
    ("x \\in [-2,7]", "[-2,8]"),
    ("x \\in [-2,7]", "(-2,7]"),
    # commands
    ("\\cot x", "\\tan x"),
    ("\\sin x", "\\cos x"),
    ("\\sin 2x", "2\\sin x"),
    # units
    ("864 \\mbox{ inches}^2", "865"),
    ("5 cm", "6"),
    ("90^\\circ", "45"),
    ("10 \\text{ inches}", "100"),
    # equations
    ("y = 2x+3", "y = 2x-3"),
    ("x = 5", "x = 6"),
    ("x = 5", "6"),
    ("y = x^2", "y = x^3"),
    # roots
    ("\\sqrt[3]{2}", "\\sqrt{2}"),
    ("\\sqrt{12}", "3\\sqrt{2}"),
    ("\\sqrt[3]{2}", "2^{1/2}"),
    ("\\sqrt{2}", "2"),
    # percent
    ("10\\%", "0.01"),
    ("10\\%", "11"),
    ("50\\%", "0.05"),
    ("10\\%", "1"),
    # infinity
    ("\\infty", "-\\infty"),
    ("-\\infty", "-1000000"),
    ("\\infty", "0"),
    # fractions and decimals
    ("0.33", "\\frac{1}{3}"),  # a decimal prediction is exact; as a reference, 0.33 is not 1/3 to 6 decimals
    ("\\frac12", "0.51"),
    ("1.5", "\\frac{2}{3}"),
    ("\\frac{1}{8}", "0.12"),
    ("\\frac{3}{4}", "\\frac{4}{3}"),
    ("10^{-20}", "0"),
    # constants, words
    ("\\pi", "3.14"),
    ("\\text{even}", "\\text{odd}"),
    ("\\text{Monday}", "\\text{Tuesday}"),
    ("(A)", "(B)"),
]

# (prediction, reference, equivalent(prediction, reference), equivalent(reference, prediction)): the decimal rule
ASYMMETRIC = [
    ("0.333333", "\\frac13", False, True),  # old: equal both ways
    ("1.41421356", "\\sqrt{2}", False, True),
    ("(3, 1.5707963)", "\\left( 3, \\frac{\\pi}{2} \\right)", False, True),  # old test: equal both ways
    ("3.1415927", "\\pi", False, True),
    ("0.6667", "\\frac{2}{3}", False, False),  # 4 decimals: not 2/3 as a reference to 6 decimals either
    ("18.0000001", "18", False, False),
]

# (model response, reference answer field, judged equal): the paper's reading of both, then the judge
RESPONSES = [
    ("Janet has 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "16 - 3 - 4 = <<16-3-4=9>>9\n9 * 2 = <<9*2=18>>18\n#### 18",
     True),
    ("The answer is: 18", "#### 18", True),
    ("The answer is 18 dollars.", "#### 18", True),
    ("So the total is $1,200.\nThe answer is: 1,200", "#### 1200", True),
    ("#### 1000001", "#### 1000000", False),  # old: equal
    ("She pays 3 * 4 = 12 dollars and gets 7 back.", "#### 7", True),  # last-number fallback
    ("She pays 3 * 4 = 12 dollars.", "#### 7", False),
    ("The answer is: 18.5", "#### 18", False),
    ("Therefore, the final answer is $\\boxed{x^3+3x-6}$.", "3x+x^3-6", True),
    ("We solve and get \\boxed{\\frac{1}{2}}, so the answer is \\boxed{0.5}", "\\frac12", True),
    ("Converting, we find $\\boxed{52_8}$.", "52_8", True),
    ("Converting, we find $\\boxed{528}$.", "52_8", False),
    ("Both roots: $\\boxed{1\\pm\\sqrt{19}}$", "1+\\sqrt{19}, 1-\\sqrt{19}", True),
    ("The answer is $(3,\\infty)\\cup(-\\infty,-2)$.", "(-\\infty,-2)\\cup(3,\\infty)", True),
    ("So \\boxed{864 \\mbox{ inches}^2} of paper.", "\\boxed{864}", True),
    ("Thus the answer is \\boxed{10\\%}.", "0.1", True),
    ("I do not know.", "#### 5", False),
    ("The final answer is \\boxed{x \\in [-2,7]}", "[-2,7]", True),
    ("The answer is: 26 feet per", "#### 26", True),
    ("The answer is: 27 feet per", "#### 26", False),
]


@pytest.mark.parametrize("a, b", EQUAL)
def test_equal_both_ways(a, b):
    assert equivalent(a, b), (a, b)
    assert equivalent(b, a), (b, a)


@pytest.mark.parametrize("a, b", DIFFERENT)
def test_different_both_ways(a, b):
    assert not equivalent(a, b), (a, b)
    assert not equivalent(b, a), (b, a)


@pytest.mark.parametrize("prediction, reference, forward, backward", ASYMMETRIC)
def test_decimal_prediction_exact_unless_the_reference_is_decimal(prediction, reference, forward, backward):
    assert equivalent(prediction, reference) is forward
    assert equivalent(reference, prediction) is backward


@pytest.mark.parametrize("response, reference, equal", RESPONSES)
def test_answers_read_from_responses(response, reference, equal):
    assert equivalent(predicted_final(response), reference_final(reference)) is equal


def test_table_size():
    assert len(EQUAL) + len(DIFFERENT) + len(ASYMMETRIC) + len(RESPONSES) >= 150


def test_missing_answer_is_never_equal():
    stats = JudgeStats()
    assert not equivalent(None, "18", stats) and not equivalent("18", None, stats)
    assert not equivalent("", "") and not equivalent("  ", "0")
    assert stats.judged == 2 and stats.timeouts == 0


def test_a_judgement_past_the_time_limit_is_not_equal_and_counted():
    stats = JudgeStats()
    # 9^(9^9) has 370 million digits: comparing it with 1 does not finish within a second (it ran for minutes)
    assert not equivalent("9^{9^{9}}", "1", stats, timeout_s=1.0)
    assert stats.timeouts == 1
    assert equivalent("x^3+3x-6", "3x+x^3-6", stats)  # the worker restarts after it is killed
    assert stats.timeouts == 1 and stats.judged == 2


def test_judge_from_worker_threads():
    """math-verify's own timeouts (SIGALRM) fail outside the main thread; the judge must not."""
    pairs = [("1000000", "1000001", False), ("\\sqrt[3]{2}", "2^{1/3}", True), ("52_8", "528", False),
             ("10\\%", "0.1", True)]
    results = {}
    threads = [threading.Thread(target=lambda i=i, a=a, b=b: results.__setitem__(i, equivalent(a, b)))
               for i, (a, b, _) in enumerate(pairs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[i] for i in range(len(pairs))] == [want for *_, want in pairs]


def test_code_is_never_run():
    assert not equivalent("__import__('os').getcwd()", "0")
    assert not equivalent("exec(1)", "exec(2)")


@settings(max_examples=40, deadline=None)
@given(st.integers(-10**15, 10**15), st.integers(1, 9))
def test_integers_compare_exactly(n, step):
    """Any integer against itself with thousands separators, and against one a few units away."""
    assert equivalent(f"{n:,}", str(n))
    assert not equivalent(str(n + step), str(n)) and not equivalent(str(n), str(n + step))


def test_a_judge_that_cannot_start_is_a_resource_error(monkeypatch):
    from toolkit.core.errors import ResourceError
    from toolkit.uq import math_answer

    worker = math_answer._Worker()
    monkeypatch.setattr(math_answer, "STARTUP_S", 5.0)
    monkeypatch.setattr(math_answer.sys, "executable", "/bin/false")
    with pytest.raises(ResourceError):
        worker.ask("1", "1", 1.0)
    assert worker.proc is None

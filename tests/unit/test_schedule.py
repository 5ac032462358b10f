"""toolkit.nn.schedule equals the closed forms the training loops used before (bit for bit)."""

import math

from toolkit.nn.schedule import cosine, linear_warmup, warmup_cosine


def test_cosine_matches_the_closed_form_bit_for_bit():
    for step in range(0, 301, 7):
        p = step / 300
        assert cosine(p) == 0.5 * (1 + math.cos(math.pi * p))
        floor = 3e-4 / 6e-4
        assert cosine(p, floor) == floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
        assert 1e-3 * cosine(p) == 1e-3 * 0.5 * (1 + math.cos(math.pi * p))
    assert cosine(-1) == 1.0 and cosine(2) == 0.0


def test_warmup_then_cosine_as_cosine_with_min_lr():
    steps, warmup, floor = 300, 20, 0.5
    for step in range(steps):
        expected = ((step + 1) / warmup if step < warmup
                    else floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * ((step - warmup) / (steps - warmup)))))
        assert warmup_cosine(step, steps, warmup, floor) == expected
    assert linear_warmup(0, 0) == 1.0 and linear_warmup(4, 10) == 0.5 and linear_warmup(50, 10) == 1.0

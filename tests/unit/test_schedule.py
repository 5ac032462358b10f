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


def test_step_form_keeps_the_loops_learning_rates_bit_identical():
    """The zoo recipe and MBU-Net computed the angle as π·step/total; cosine_steps keeps that order."""
    from toolkit.nn.schedule import cosine_steps

    for warmup, total in ((10, 100), (50, 2000), (7, 13)):
        for s in range(total + 3):
            zoo = min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
            assert linear_warmup(s, warmup) * cosine_steps(min(s, total), total) == zoo
            assert 2e-3 * cosine_steps(min(s, total), total) == 2e-3 * 0.5 * (
                1 + math.cos(math.pi * min(s, total) / total))

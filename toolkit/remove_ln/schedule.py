"""The removal schedule of the official GPT-2 small config, scaled to any depth and number of steps.

Official `gpt2` config (12 layers, 300 steps): ln_2(i) at 20 + 2i, ln_1-QK(i) at 44 + 2i, ln_1-V(i) at 68 + 3i,
ln_f at 104, EOT at 106, BOS at 116. Here the same event order and relative gaps (2/2/3 per layer, +3 to ln_f,
+2 to EOT, +12 to BOS) are laid out between `start_fraction·steps` and `end_fraction·steps`.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.core.errors import BadInputError
from toolkit.remove_ln.fakeln import FakeLNModel

KINDS = ("ln_2", "ln_1_qk", "ln_1_v", "ln_f", "eot", "bos")


@dataclass(frozen=True)
class Event:
    step: int
    kind: str  # one of KINDS
    layer: int | None = None

    @property
    def name(self) -> str:
        return f"blocks.{self.layer}.{self.kind}" if self.layer is not None else self.kind


def paper_offsets(n_layers: int, gaps: tuple[int, int, int] = (2, 2, 3), gap_ln_f: int = 3, gap_eot: int = 2,
                  gap_bos: int = 12) -> list[tuple[float, str, int | None]]:
    """Events at the official relative positions (paper step units, first event at 0)."""
    g2, gqk, gv = gaps
    events = [(i * g2, "ln_2", i) for i in range(n_layers)]
    events += [(n_layers * g2 + i * gqk, "ln_1_qk", i) for i in range(n_layers)]
    events += [(n_layers * (g2 + gqk) + i * gv, "ln_1_v", i) for i in range(n_layers)]
    ln_f = n_layers * (g2 + gqk + gv) - gv + gap_ln_f
    events += [(ln_f, "ln_f", None), (ln_f + gap_eot, "eot", None), (ln_f + gap_bos, "bos", None)]
    return events


def build_schedule(n_layers: int, steps: int, start_fraction: float = 20 / 300, end_fraction: float = 116 / 300,
                   gaps: tuple[int, int, int] = (2, 2, 3)) -> list[Event]:
    """Every LN position of an n-layer GPT-2 gets its own step; refuses runs too short for that."""
    if n_layers < 1:
        raise BadInputError("the model has no blocks")
    if not 0 <= start_fraction < end_fraction <= 1:
        raise BadInputError(f"need 0 <= start_fraction < end_fraction <= 1, got {start_fraction}, {end_fraction}")
    offsets = paper_offsets(n_layers, gaps)
    first, last = round(start_fraction * steps), min(round(end_fraction * steps), steps - 1)
    if last - first + 1 < len(offsets):
        need = int((len(offsets) + 1) / (end_fraction - start_fraction)) + 1
        raise BadInputError(f"{steps} training steps are too few for the removal schedule of {n_layers} layers "
                            f"({len(offsets)} LN positions each need their own step)",
                            f"use at least {need} steps (more tokens) or widen start/end_fraction")
    span = offsets[-1][0]
    events, previous = [], first - 1
    for remaining, (offset, kind, layer) in zip(range(len(offsets) - 1, -1, -1), offsets):
        step = first + round(offset / span * (last - first))
        step = min(max(step, previous + 1), last - remaining)  # strictly increasing, room for the rest
        events.append(Event(step, kind, layer))
        previous = step
    return events


def apply_schedule(handle: FakeLNModel, events: list[Event], step: int) -> list[Event]:
    """Set every flag whose event step is <= `step` (idempotent, so resuming at any step is exact)."""
    applied = []
    for event in events:
        if event.step > step:
            continue
        applied.append(event)
        if event.kind == "eot":
            handle.specials.keep_eot.fill_(False)
        elif event.kind == "bos":
            handle.specials.keep_bos.fill_(False)
        else:
            target = {"ln_2": handle.ln2, "ln_1_qk": handle.ln1_qk, "ln_1_v": handle.ln1_v}.get(event.kind)
            (handle.ln_f if target is None else target[event.layer]).fake.fill_(True)
    return applied

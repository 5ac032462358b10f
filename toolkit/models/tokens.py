"""Tokenizer facts every technique needs, decided once."""

from __future__ import annotations


def pad_id(tokenizer) -> int:
    """The id used to pad batches: the tokenizer's pad token, else its EOS token, else 0 (never None)."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if candidate is not None:
            return int(candidate)
    return 0

"""Prompt inference: MHLP (Textual Bayes) — the system prompt as a Bayesian parameter."""

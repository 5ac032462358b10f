"""Uncertainty quantification for LLM reasoning: TokUR token-level uncertainty."""

"""Retrieval-augmented generation: DeepRAG (step-wise retrieve-or-answer decisions) and its baselines."""

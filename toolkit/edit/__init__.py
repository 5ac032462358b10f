"""Knowledge editing: MEMIT (closed-form multi-layer insertion) and EAMET (embedding-aligned value optimisation)."""

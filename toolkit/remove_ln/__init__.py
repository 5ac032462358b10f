"""LayerNorm removal by fine-tuning (Baroni et al., arXiv 2507.02559): FakeLN, schedule, training, export, DLA."""

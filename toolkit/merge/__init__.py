"""Model merging: LS-Merge (latent-space merging with a weight VAE) and weight-space baselines."""

"""Inference-time defenses: X-GRAAD backdoor detection/neutralisation, attack tooling, STRIP and ONION baselines."""

"""Unlearning: PRISM (dual-space smoothness) and the baselines it is compared against (GA, NPO+GDR, RMU),
plus the MUSE-style evaluation and the relearning / jailbreak attacks."""

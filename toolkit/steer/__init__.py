"""Personalized safety steering: PCMS, UMS and ILCS direction estimators, hook-based intervention, evaluation."""

from toolkit.core.registry import declare

declare("steer", "toolkit.steer.methods")  # every module there registers its estimator(s) (torch-free)

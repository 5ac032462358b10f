"""Personalized safety steering: PCMS, UMS and ILCS direction estimators, hook-based intervention, evaluation."""

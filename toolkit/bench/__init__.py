"""Benchmark harnesses: VideoMathQA (lmms-eval scoring) and MMSearch-Plus (agent loop, tools, judge)."""

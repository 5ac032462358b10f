"""iclrkit: ICLR 2026 techniques as tools for your own models and data."""

__version__ = "0.1.0"

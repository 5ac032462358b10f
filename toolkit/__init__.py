"""iclrkit: ICLR 2026 techniques as tools for your own models and data."""

__version__ = "0.1.0"

# Model formats that `--model` accepts beyond what transformers loads: loaders register themselves in the
# "model-format" registry (toolkit.models.source asks it), the modules that hold them are named here, at the root
# that assembles the layers, so models/ never imports a technique.
from toolkit.core.registry import declare as _declare  # noqa: E402

_declare("model-format", "toolkit.export.quantized")  # a compress run's packed/ directory

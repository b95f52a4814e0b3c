"""sparkseal: hermetic, bit-reproducible build of a DSpark-enabled vLLM for NVIDIA GB10."""

__version__ = "0.1.0"

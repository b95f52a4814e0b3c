"""Tests that need an NVIDIA GPU (pytest -m gpu; docs/layout.md)."""

"""Kernel bindings: the compiled library's loader, its torch ops, and their PyTorch references."""

"""Run-time pieces: kernel bindings, module verification, the vLLM plugin, live-check (in the image)."""

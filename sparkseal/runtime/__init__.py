"""Run-time pieces: kernel bindings, module verification, the vLLM plugin (torch/vllm at run time only)."""

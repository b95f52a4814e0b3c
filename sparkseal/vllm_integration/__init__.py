"""vLLM integration: the plugin vLLM loads, the sparse-MLA attention backend, the DeepSeek V4 decode class."""

"""OCI images with the container tools: assembly, load, push, run, the whole image (docs/layout.md)."""

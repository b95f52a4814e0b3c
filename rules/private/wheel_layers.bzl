"""Which image layer each locked wheel goes to: a leaf both the image and the python_lock hub load.

`rules/private/image.bzl` composes the image from these layers; `rules/private/python_lock.bzl` (a
repository rule) and the `requirements.bzl` it generates sort the locked wheels between them. Kept apart
from the image rules so that a repository rule loads no build rule: this file loads nothing.
"""

TORCH_LAYER = "torch"
DEPS_LAYER = "deps"

# What each wheel layer holds (for the generated requirements.bzl and the docs).
WHEEL_LAYERS = {
    TORCH_LAYER: "torch, torchaudio, torchvision, triton and NVIDIA's CUDA wheels (nvidia-*, cuda-*)",
    DEPS_LAYER: "every other locked wheel",
}

# Projects released together with torch; with NVIDIA's CUDA wheels they make the large, rarely changing layer.
_TORCH_LAYER_PROJECTS = ["torch", "torchaudio", "torchvision", "triton"]
_TORCH_LAYER_PREFIXES = ["nvidia-", "cuda-"]

def layer_of(project):
    """The wheel layer of a normalised project name: `torch` or `deps`."""
    if project in _TORCH_LAYER_PROJECTS:
        return TORCH_LAYER
    for prefix in _TORCH_LAYER_PREFIXES:
        if project.startswith(prefix):
            return TORCH_LAYER
    return DEPS_LAYER

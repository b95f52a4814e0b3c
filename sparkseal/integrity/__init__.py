"""Module verification in the image: installed files against the module manifest; the entrypoint."""

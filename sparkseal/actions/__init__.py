"""Action programs: one module per Bazel action, named after the rule that runs it, each a flat ``main``."""

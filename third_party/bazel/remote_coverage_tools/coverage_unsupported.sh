#!/bin/sh
echo "sparkseal: coverage collection through Bazel is not supported in this workspace" >&2
exit 1

"""Determinism constants shared by every action that writes an archive or a tree.

Each value is fixed here, once, so that two builds on two machines give the same bytes.
"""

# 1980-01-01T00:00:00Z: the earliest instant a ZIP local header can store (its DOS date starts in
# 1980). pex and rules_python date wheel entries the same way; tar layers use it too so that one
# epoch describes every artifact.
SOURCE_DATE_EPOCH = 315532800
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)

# Regular files are world-readable; executables (upstream had any x bit) keep 0o755. Nothing else
# of the builder's umask survives.
FILE_MODE = 0o644
EXEC_MODE = 0o755
DIR_MODE = 0o755
# The only non-0755 directory mode a layer may ask for: the sticky, world-writable mode the FHS gives
# /tmp and /var/tmp, which programs creating temporary files rely on.
STICKY_DIR_MODE = 0o1777

# Owner of every archive member: root, with empty names, as OCI layers and wheels expect.
UID = 0
GID = 0

# zlib level for deflated entries: the default level, named so that a change is a visible decision.
ZLIB_LEVEL = 6

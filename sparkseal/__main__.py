"""``python3 -m sparkseal``: the ``sparkseal`` command."""

import sys

from sparkseal.cli import main

sys.exit(main())

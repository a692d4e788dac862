"""``python -m server``: the same as ``tierkit serve`` (flags, env vars, config file)."""

import sys

from server.cli import main

sys.exit(main())

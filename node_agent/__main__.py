"""``python -m node_agent`` is ``fiar-agent``."""

import sys

from node_agent.cli import main

sys.exit(main())

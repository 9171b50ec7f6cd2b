"""``python -m pollux.cli``: the ``pollux`` command."""

import sys

from pollux.cli.entry import main

sys.exit(main())

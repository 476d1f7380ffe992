"""``python -m loomrl.cli``: the ``loomrl`` command."""

import sys

from loomrl.cli import main

sys.exit(main())

"""``python -m ckptio.cli``: the ``ckptio`` command."""

import sys

from ckptio.cli import main

sys.exit(main())

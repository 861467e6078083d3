"""``python -m batch``: the batch service (see :mod:`batch.service`)."""

import sys

from batch.service import main

sys.exit(main())

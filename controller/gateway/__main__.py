"""``python -m controller.gateway``: the gateway process (see ``process.py``)."""

import sys

from controller.gateway.lifecycle.process import main

sys.exit(main())

"""python -m flashinfer_trace.cli: the `flashinfer-trace` command."""

import sys

from . import main

sys.exit(main())

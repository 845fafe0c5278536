"""``python -m lra.bench``: the side-by-side CLI of :mod:`lra.bench.harness`."""
import sys

from lra.bench.harness import main

sys.exit(main())

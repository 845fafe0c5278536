"""CUDA autocast's dtype policy emulated by CPU autocast: :mod:`lra.checks.cuda_autocast` (the variant
check, ``python run.py mode=check``, runs its float16 property under it on a CPU machine)."""
from __future__ import annotations

from lra.checks.cuda_autocast import *  # noqa: F401,F403
from lra.checks.cuda_autocast import SKIPPED, cuda_autocast_policy  # noqa: F401

"""streamlab: how a language model's text reaches a reader, measured."""

from __future__ import annotations

__version__ = "0.1.0"

import os as _os

# Before anything loads torch and its OpenMP: idle OpenMP threads spin (~300,000 turns) after
# every parallel region unless the process runs more of them than there are cores. A thread per
# generation gets the short spin that way; one batched loop, or a loop on the main thread after
# another thread had the model, does not, and on a shared 2-core machine the spinning helpers took
# the cores from the work (a step 5-10x slower, measured with benchmarks/load.py and
# benchmarks/overhead.py). 1,000 turns is what the threads get anyway. A value set outside wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "1000")

# Nothing is re-exported here: every name is imported from the module that defines it
# (``from streamlab.model.loading import load_model``), as tests/test_layers.py checks.
__all__ = ["__version__"]

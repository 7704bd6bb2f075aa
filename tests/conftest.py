"""Settings for every test process, and for the subprocesses and notebook kernels the tests start (inherited).

One thread per process: the tiny models gain nothing from a second one, and on a loaded machine a torch thread
pool spinning against other processes slows a run many-fold. Set before any test module imports torch."""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

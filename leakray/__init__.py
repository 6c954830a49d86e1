"""leakray: does a code LLM know the benchmark it is evaluated on?"""

import os

__version__ = "0.1.0"

# OpenMP threads waiting at a barrier spin by default (libgomp, in torch's CPU wheels) rather than
# sleep. leakray's processes share the CPUs (the driver's torch beside Ray's workers, detectors'
# fits beside each other), and a spinning thread burns the core another process is waiting for:
# on two cores, two processes of two torch threads each took ~50x the CPU they need, and the
# demo's detect stage took 20% less wall and CPU, with the same table, with passive waiting. Alone,
# a loop of small products runs up to 1.6x slower passive; a short spin (GOMP_SPINCOUNT=1000) is
# between on both (benchmarks/bench_omp_wait.py; docs/MEASUREMENTS.md). libgomp reads the variable
# once, when torch loads it, so it is set here, before any leakray module imports torch; child
# processes (a local Ray's workers, subprocesses) inherit it. A value already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

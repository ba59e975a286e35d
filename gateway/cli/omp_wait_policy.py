"""OpenMP workers that sleep when they wait, set before torch loads its OpenMP runtime.

libgomp's default lets a worker spin for a while at every barrier. That is the fastest choice
for one process alone on idle cores, and a disaster when the cores are shared: the gateway
runs an event loop, one engine thread per tier and each engine's OpenMP team in one process,
often beside other work, and a spinning worker burns the time slice that the thread it waits
for needed. Measured on a 2-core machine with other work running: a 1x576x1536 packed GEMM took
7.5 ms with spinning workers and 0.41 ms with sleeping ones, and SmolLM2's decode step
450-870 ms against 99-125 ms. An operator who wants spinning sets OMP_WAIT_POLICY themselves.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

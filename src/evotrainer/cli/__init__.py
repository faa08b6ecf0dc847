"""The `evotrainer` command line: one command table (``main``) for the stage entry points the Snakemake
rules call and the commands people use (config, status, show, lineage, compare, approve, ...)."""

import os

# Torch's OpenMP threads wait for work passively rather than spinning. libgomp reads this once, when torch loads,
# so it is set here, before any command imports torch; the jobs and the fork server this process starts inherit
# it. With spinning threads, two 2-thread jobs on the same 2 cores (two runs, or a run beside the tests) each took
# ~10x as long as alone; passive, ~1.3x, and alone it costs nothing measurable (docs/testing.md). A value the user
# set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

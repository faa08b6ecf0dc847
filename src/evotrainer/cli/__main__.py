"""`python -m evotrainer.cli ...` (what the Snakemake rules call). With EVOTRAINER_FORKSERVER=1 (set by the
Snakefile for local runs) the command runs in a child of the preloaded fork server (evotrainer.forkserver)."""

import os
import sys

if os.environ.get("EVOTRAINER_FORKSERVER") == "1":
    from evotrainer.cli.fork_entry import ENTRY, PRELOAD
    from evotrainer.forkserver import run_via_server

    sys.exit(run_via_server(sys.argv[1:], ENTRY, PRELOAD))

from evotrainer.cli.main import main

sys.exit(main())

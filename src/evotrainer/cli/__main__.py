"""`python -m evotrainer.cli ...` (what the Snakemake rules call)."""

import sys

from evotrainer.cli.main import main

sys.exit(main())

"""The `evotrainer` command line: one command table (``main``) for the stage entry points the Snakemake
rules call and the commands people use (config, status, show, lineage, compare, approve, ...)."""

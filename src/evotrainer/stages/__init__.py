"""One module per workflow stage, each with one public entry ``run(...)``."""

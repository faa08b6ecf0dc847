"""What a person reads at the end: the self-contained HTML report of one run (``html``) and the multi-seed
headline comparison of the evolved line against the fixed-recipe baseline (``headline``)."""

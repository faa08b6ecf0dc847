"""Data and trusted judging for ``task=code``: the embedded procedural problems (``procedural``), HumanEval
records (``humaneval``), program extraction, test parsing and output comparison (``judge``) and the task's
validity gate (``gates``)."""

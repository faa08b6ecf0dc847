"""EvoTrainer: RL training that co-evolves the harness (reward, curriculum, recipe, diagnostics)."""

__version__ = "0.1.0"

"""Multi-turn, text-based environments for the agentic domain (gym-shaped: ``reset`` and ``step``), found
through a registry that also reads the ``evotrainer.envs`` entry-point group."""

"""verl trainer backend: recipe -> Hydra overrides, task data -> verl parquet, the trusted reward shim
(sandboxed harness reward, task verdict first), the trainer (`launch.train`: `python -m
verl.trainer.main_ppo`, Ray on SLURM), and verl metrics -> train log / evidence."""

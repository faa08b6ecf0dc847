"""verl trainer backend: recipe -> Hydra overrides, task data -> verl parquet, reward adapter,
launcher (`python -m verl.trainer.main_ppo`, Ray on SLURM), and verl metrics -> train_log/evidence."""

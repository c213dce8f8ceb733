"""Batch jobs: Slurm via submitit (jobs.slurm), TorchX components (jobs.components), the Ray-on-Slurm
bootstrap they share (jobs.bootstrap), and a smoke recipe that checks a cluster end to end (jobs.smoke)."""

"""Evaluations: BIRD execution accuracy (`python -m evals.bird`), LongBench QA (`python -m evals.longbench`).
Each is a command-line module with its scoring importable as functions, so tests and the
training loop's periodic evals call the same code."""

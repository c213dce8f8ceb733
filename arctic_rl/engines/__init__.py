"""Engines: training (DeepSpeed), log-prob/reference, sampling (vLLM). Import submodules directly;
this package imports nothing heavy so `arctic_rl.engines.forward` stays cheap."""

"""Native verl (its own FSDP actor and vLLM rollout) made to run on a CPU-only machine, as the baseline that
`arctic-rl compare` measures verl + arctic-rl against. Nothing here is on arctic-rl's product path: each shim
stands in for one GPU-only piece of verl 0.9.1 and names it (docs/frameworks.md lists the blockers)."""

"""SkyRL integration (work in progress): the batch layout translation between skyrl-train 0.3.1's
`TrainingInputBatch` / `GeneratorOutput` and arctic-rl's batch. See docs/frameworks.md for what runs."""

"""SkyRL integration: skyrl-train 0.3.1's trainer loop with arctic-rl as policy, reference and sampler.

    main.py       the entrypoint (`.venv-skyrl/bin/python -m recipes.skyrl.main <SkyRL overrides>`)
    trainer.py    ArcticPPOTrainer (RayPPOTrainer with client ops) and the config / loss mapping
    generator.py  ArcticGenerator (samples through arctic-rl, scores with an arctic-rl recipe)
    data.py       SkyRL dataset files from any arctic-rl recipe
    layout.py     TrainingInputBatch / GeneratorOutput <-> arctic-rl batch
    configs/      native-SkyRL baselines with the same hyper-parameters
See docs/frameworks.md."""

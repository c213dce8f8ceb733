"""The `arctic-rl` command.

    arctic-rl run CONFIG.yaml [dotted.key=value ...]   the reference GRPO loop (arctic_rl.loop)
    arctic-rl serve --config CFG.json [...]            the HTTP backend (arctic_rl.server.http)
    arctic-rl compare ...                              phase speedups from MLflow runs (arctic_rl.compare)
    arctic-rl plan CONFIG.yaml --nodes N --gpus-per-node G   placement, memory, CPUs; exit 1 if it cannot fit
    arctic-rl export CKPT --out DIR                    a checkpoint as a Hugging Face folder (arctic_rl.export)
    arctic-rl demo-model ...                           the bundled small model (arctic_rl.demo_model)

Subcommands import their module only when run, so `arctic-rl --help` stays fast.
"""

from __future__ import annotations

import sys

USAGE = __doc__.split("\n\n")[1]


def _run(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="arctic-rl run", description="Run a recipe with the reference GRPO loop.")
    p.add_argument("config", help="run config YAML (see arctic_rl/runconfig.py)")
    p.add_argument("overrides", nargs="*", help="dotted.key=value, value parsed as YAML")
    a = p.parse_args(argv)
    from arctic_rl.errors import ConfigError
    from arctic_rl.loop import run
    from arctic_rl.runconfig import load_run_config

    try:
        cfg = load_run_config(a.config, a.overrides)
    except ConfigError as e:
        print(f"arctic-rl run: {e}", file=sys.stderr)
        return 2
    run(cfg)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage:\n" + USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        return _run(rest)
    if cmd == "serve":
        from arctic_rl.server.http import main as serve

        return serve(rest) or 0
    if cmd == "compare":
        from arctic_rl.compare import main as compare

        return compare(rest) or 0
    if cmd == "plan":
        from arctic_rl.plan import main as plan

        return plan(rest)
    if cmd == "export":
        from arctic_rl.export import main as export

        return export(rest) or 0
    if cmd == "demo-model":
        from arctic_rl.demo_model import main as demo_model

        return demo_model(rest) or 0
    print(
        f"arctic-rl: unknown command {cmd!r}; expected one of run, serve, compare, plan, export, demo-model\nusage:\n{USAGE}",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

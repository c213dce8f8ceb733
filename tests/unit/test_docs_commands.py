"""Every command and run-config snippet in README.md and docs/**/*.md parses, as written.

What is extracted:
- shell commands: the lines of ```bash and ```sh blocks (continuation lines joined, `# comments` dropped), the
  `$ ` lines of ```console blocks, and `$ ` lines outside any block;
- YAML: every ```yaml block.

How a command is checked (nothing is run, no process is started):
- leading `NAME=value` environment assignments and `sudo` are dropped; a pipe, `;`, `&&` or a redirection is an
  error (a documented command is one command);
- `arctic-rl ...` (or `python -m arctic_rl.cli ...`): arctic_rl.cli's own argparse parsers parse it (the parse
  is stopped right after argparse returns); `arctic-rl run CONFIG k=v ...` also loads CONFIG with its overrides
  through the run config model (arctic_rl/runconfig.py), so an unknown key or a bad value fails;
- `python -m jobs.slurm ...`: jobs.slurm.build_parser() plus its key=value rule; the overrides are validated
  against the recipe's config (--config, else recipes/<recipe>/configs/default.yaml);
- `python -m evals.bird ...` / `python -m evals.longbench ...`: those modules' argparse parsers;
- `python FILE.py ...` for a file of this repository (benchmarks): the file exists and its argparse parser
  accepts the arguments;
- `torchx ...`: torchx's own CLI parser; for `torchx run ... jobs/components.py:recipe ARGS`, torchx's
  component-argument parser over the component's signature, and the overrides after `--` as above;
- `make TARGET`: TARGET is a target of the Makefile;
- a path to a script of this repository (`scripts/x.sh`, `recipes/verl/configs/x.sh`, `bash x.sh`): it exists
  (its own arguments are not checked);
- programs that cannot be checked here are listed in UNCHECKED_PROGRAMS / UNCHECKED_MODULES with the reason.

A YAML snippet "looks like a run config" when it is a mapping whose top-level keys are all fields of the run
config model (RunConfig); such a snippet is merged over recipes/toy/configs/default.yaml (a complete config) and
validated, so its keys and values are checked. Any other YAML snippet must at least parse as YAML.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from repo_paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Programs this test cannot check, by name, and why.
UNCHECKED_PROGRAMS = {
    "sbatch": "Slurm's own CLI",
    "scontrol": "Slurm's own CLI",
    "squeue": "Slurm's own CLI",
    "git": "git's own CLI",
    "pip": "pip's own CLI",
    "cd": "a shell builtin",
    "export": "a shell builtin",
    "source": "a shell builtin",
    ".venv-skyrl/bin/python": "SkyRL's own environment (Python 3.12), absent from a fresh clone",
}
# Modules run with `python -m` whose arguments are another framework's Hydra overrides.
UNCHECKED_MODULES = {
    "recipes.verl.main": "verl's Hydra config (verl is installed --no-deps beside the main environment)",
    "verl.trainer.main_ppo": "verl's Hydra config",
    "recipes.skyrl.main": "SkyRL's Hydra config (SkyRL lives in .venv-skyrl)",
    "recipes.skyrl.native": "SkyRL's Hydra config (SkyRL lives in .venv-skyrl)",
    "skyrl_train.entrypoints.main_base": "SkyRL's Hydra config",
}
PYTHONS = {"python", "python3", ".venv/bin/python", sys.executable}
OPERATORS = {"|", "||", "&", "&&", ";", "<", ">", ">>", "(", ")"}


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def shell_commands(path: Path) -> list[str]:
    """The commands of `path`: ```bash/```sh lines, `$ ` lines of ```console blocks and outside blocks."""
    text = path.read_text()
    commands = []
    for lang, body in _blocks(text):
        if lang in ("bash", "sh"):
            lines = re.sub(r"\s*\\\n\s*", " ", body).splitlines()
        elif lang == "console":
            lines = [line.strip()[2:] for line in body.splitlines() if line.strip().startswith("$ ")]
        else:
            continue
        commands += [c for c in (re.sub(r"(^|\s+)#.*$", "", line).strip() for line in lines) if c]
    outside = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    commands += [line.strip()[2:].strip() for line in outside.splitlines() if line.strip().startswith("$ ")]
    return commands


def yaml_snippets(path: Path) -> list[str]:
    return [body for lang, body in _blocks(path.read_text()) if lang in ("yaml", "yml")]


def _cases(kind) -> list:
    return [
        pytest.param(path, item, id=f"{path.relative_to(REPO)}: {item[:60]}") for path in DOCS for item in kind(path)
    ]


class Parsed(Exception):  # noqa: N818  (not an error: argparse returned)
    def __init__(self, namespace: argparse.Namespace, extra: list[str]):
        self.namespace, self.extra = namespace, extra


@contextlib.contextmanager
def stop_after_parsing():
    """Inside: argparse parses as usual, and when the outermost parse returns, Parsed is raised instead of
    letting the program run on."""
    real = argparse.ArgumentParser.parse_known_args
    depth = [0]

    def parse_known_args(self, args=None, namespace=None):
        depth[0] += 1
        try:
            namespace, extra = real(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise Parsed(namespace, extra)
        return namespace, extra

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = real


def _parse_with(main, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Call `main(argv)` up to the end of its argparse parse; a usage error fails with argparse's message."""
    try:
        with stop_after_parsing():
            main(argv)
    except Parsed as parsed:
        return parsed.namespace, parsed.extra
    except SystemExit as e:
        pytest.fail(f"argparse refused {argv}: exit {e.code} (message above)")
    pytest.fail(f"{argv}: no argparse parse happened")


def _check_overrides(config: str, overrides: list[str]) -> None:
    from arctic_rl.errors import ConfigError
    from arctic_rl.runconfig import load_run_config

    try:
        load_run_config(REPO / config, overrides)
    except ConfigError as e:
        pytest.fail(f"run config {config} with {overrides}: {e}")


def _recipe_config(recipe: str, config: str | None) -> str:
    return config or f"recipes/{recipe}/configs/default.yaml"


def check_arctic_rl(argv: list[str]) -> None:
    from arctic_rl import cli

    if not argv or argv[0] in ("-h", "--help"):
        return
    namespace, extra = _parse_with(cli.main, argv)
    assert not extra, f"arctic-rl {argv[0]}: unrecognized arguments {extra}"
    if argv[0] == "run":
        _check_overrides(namespace.config, namespace.overrides)


def check_jobs_slurm(argv: list[str]) -> None:
    from jobs import slurm

    try:
        args, extra = slurm.build_parser().parse_known_args(argv)
    except SystemExit as e:
        pytest.fail(f"python -m jobs.slurm refused {argv}: exit {e.code}")
    bad = [item for item in extra if "=" not in item or item.startswith("-")]
    assert not bad, f"python -m jobs.slurm: unrecognized arguments {bad}"
    if args.action == "submit" and not args.command:
        _check_overrides(_recipe_config(args.recipe, args.config), extra)


def check_eval(module: str, argv: list[str]) -> None:
    main = __import__(module, fromlist=["main"]).main
    _, extra = _parse_with(main, argv)
    assert not extra, f"python -m {module}: unrecognized arguments {extra}"


def check_script(script: str, argv: list[str], monkeypatch) -> None:
    path = REPO / script
    assert path.is_file() and path.resolve().is_relative_to(REPO), f"{script} is not a file of this repository"
    monkeypatch.syspath_prepend(str(path.parent))
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    try:
        with stop_after_parsing():
            runpy.run_path(str(path), run_name="__main__")
    except Parsed as parsed:
        assert not parsed.extra, f"{script}: unrecognized arguments {parsed.extra}"
    except SystemExit as e:
        pytest.fail(f"{script} refused {argv}: exit {e.code}")
    else:
        pytest.fail(f"{script}: no argparse parse happened")


def check_torchx(argv: list[str]) -> None:
    from torchx.cli import argparse_util
    from torchx.cli.main import create_parser, get_sub_cmds
    from torchx.specs.builders import parse_args

    # torchx's options that .torchxconfig can default remember what was given in a class attribute, once per
    # process in its CLI: a second documented torchx command parsed here failed with "-s is specified more than
    # once". Cleared, each command is parsed as a fresh `torchx` would.
    for action in vars(argparse_util).values():
        if isinstance(action, type) and isinstance(getattr(action, "called_args", None), set):
            action.called_args.clear()
    try:
        args = create_parser(get_sub_cmds()).parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"torchx refused {argv}: exit {e.code}")
    if argv[0] != "run":
        return
    component, *component_args = args.component_name_and_args
    assert component == "jobs/components.py:recipe", f"torchx run of an unknown component {component!r}"
    from jobs.components import recipe

    try:
        parsed = parse_args(recipe, component_args)
    except SystemExit as e:
        pytest.fail(f"torchx: jobs/components.py:recipe refused {component_args}: exit {e.code}")
    overrides = [o for o in parsed.overrides if o != "--"]
    if not parsed.command:
        _check_overrides(_recipe_config(parsed.recipe, parsed.config or None), overrides)


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", (REPO / "Makefile").read_text(), flags=re.M))


def _tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


@pytest.mark.parametrize(("doc", "command"), _cases(shell_commands))
def test_documented_command_parses(doc: Path, command: str, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    try:
        argv = _tokens(command)
    except ValueError as e:
        pytest.fail(f"not a shell command ({e})")
    while argv and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]) or argv[0] == "sudo"):
        argv = argv[1:]
    assert argv, "an empty command"
    program, rest = argv[0], argv[1:]
    if program in UNCHECKED_PROGRAMS:
        return
    if program in PYTHONS and rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in UNCHECKED_MODULES:
        return
    ops = sorted(set(argv) & OPERATORS)
    assert not ops, f"shell operators {ops}: document one command per line"
    if program in PYTHONS and rest[:1] == ["-m"]:
        module, args = rest[1], rest[2:]
        if module == "arctic_rl.cli":
            return check_arctic_rl(args)
        if module == "jobs.slurm":
            return check_jobs_slurm(args)
        if module in ("evals.bird", "evals.longbench"):
            return check_eval(module, args)
        pytest.fail(f"python -m {module}: no check for this module (add one, or list it in UNCHECKED_MODULES)")
    if program in PYTHONS:
        assert rest and rest[0].endswith(".py"), f"python {rest}: expected -m MODULE or a script"
        return check_script(rest[0], rest[1:], monkeypatch)
    if program in ("arctic-rl", ".venv/bin/arctic-rl"):
        return check_arctic_rl(rest)
    if program == "torchx":
        return check_torchx(rest)
    if program == "make":
        unknown = [t for t in rest if not t.startswith("-") and "=" not in t and t not in make_targets()]
        assert not unknown, f"make: no target {unknown} in the Makefile ({sorted(make_targets())})"
        return
    script = rest[0] if program == "bash" and rest else program
    if "/" in script or script.endswith(".sh"):
        assert (REPO / script).is_file(), f"{script}: no such file in the repository"
        return
    pytest.fail(f"{program}: no check for this program (add one, or list it in UNCHECKED_PROGRAMS)")


def _looks_like_run_config(data: object) -> bool:
    from arctic_rl.runconfig import RunConfig

    fields = set(RunConfig.model_fields) | {a.alias for a in RunConfig.model_fields.values() if a.alias}
    return isinstance(data, dict) and bool(data) and set(data) <= fields


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize(("doc", "snippet"), _cases(yaml_snippets))
def test_documented_yaml_parses(doc: Path, snippet: str) -> None:
    from arctic_rl.errors import ConfigError
    from arctic_rl.runconfig import parse_run_config

    data = yaml.safe_load(snippet)
    if _looks_like_run_config(data):
        base = yaml.safe_load((REPO / "recipes/toy/configs/default.yaml").read_text())
        try:
            parse_run_config(_merge(base, data), source=f"{doc.name} snippet")
        except ConfigError as e:
            pytest.fail(str(e))


def test_extraction_rule() -> None:
    """The extraction itself, on a sample: blocks, continuation lines, comments, console prompts."""
    sample = REPO / "tests" / "data" / "docs_commands_sample.md"
    assert shell_commands(sample) == [
        "make test",
        "python -m jobs.slurm submit --recipe toy --nodes 2 train.steps=2",
        "arctic-rl plan recipes/toy/configs/default.yaml --nodes 1 --gpus-per-node 8",
        "arctic-rl --help",
    ]
    assert yaml_snippets(sample) == ["train:\n  steps: 2\n"]


@pytest.mark.parametrize(
    "command",
    [
        "arctic-rl run recipes/toy/configs/default.yaml train.no_such_key=1",
        "arctic-rl compare --no-such-flag",
        "python -m jobs.slurm submit --recipe toy --nodes two",
        "python -m evals.bird --split dev",
        "torchx run -s slurm jobs/components.py:recipe --recipe toy --no_such_arg 1",
        "make no-such-target",
        "scripts/no_such_script.sh",
        "arctic-rl run recipes/toy/configs/default.yaml | tee log",
        "frobnicate --now",
    ],
)
def test_a_wrong_command_fails_the_check(command: str, monkeypatch) -> None:
    """The checks can fail: each of these is wrong in one way."""
    with pytest.raises((pytest.fail.Exception, AssertionError)):
        test_documented_command_parses(REPO / "README.md", command, monkeypatch)


def test_a_wrong_run_config_snippet_fails_the_check() -> None:
    with pytest.raises((pytest.fail.Exception, AssertionError)):
        test_documented_yaml_parses(REPO / "README.md", "train:\n  steps: -3\n")

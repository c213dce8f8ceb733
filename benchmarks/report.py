"""The dated report every benchmark writes: docs/benchmarks/<name>-<YYYY-MM-DD>.md.

Measured numbers live in these files only (not in docstrings, comments or the README), one file per run,
so a figure has one place and its date, machine and load beside it. A report holds what the run needs to
be judged on another machine: the date, the command, the machine (CPU, cores, threads, memory, GPU, and a
streaming-copy rate, since the memory-bound ratios follow the machine's memory bandwidth), the load average
at the start and at the end, each ratio beside its theoretical limit, and the rates that explain a ratio.

    report = Report.start("cascade_attention", "Cascade vs standard decode attention", args)
    report.add("main point", level="op", heads="16/16", ratio=10.2, limit=11.0, std_GBps=15.1)
    report.write()   # -> docs/benchmarks/cascade_attention-2026-12-01.md

A run with reduced sizes (`--quick`) is labelled: its file is <name>-<date>-quick.md and says so at the top.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPORT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def add_report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report-dir", type=Path, default=REPORT_DIR, help="where the dated markdown report goes (docs/benchmarks)"
    )


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def copy_rate_GBps(mib: int = 256) -> float:
    """Bytes/s of a plain tensor copy, read + write counted (best of 3): the memory bandwidth a
    memory-bound ratio is judged against."""
    import torch

    src = torch.ones(mib * 2**18)  # fp32: mib MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The instruction sets the CPU numbers depend on (bf16 and matmul speed above all): the machines differ here.
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return " ".join(f for f in SIMD_FLAGS if f in have) or "none of " + " ".join(SIMD_FLAGS)
    except OSError:
        pass
    return "unknown"


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def machine(device: str = "cpu", bandwidth: bool = False) -> dict[str, str]:
    """What the numbers depend on. Torch is described only if the benchmark already imported it."""
    info = {
        "host": platform.node(),
        "cpu": f"{_cpu_model()}, {os.cpu_count()} logical cores",
        "cpu flags": _cpu_flags(),
        "memory": _memory_gib(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = f"{torch.__version__}, {torch.get_num_threads()} threads"
        if device == "cuda" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    if bandwidth:
        info["copy rate"] = f"{copy_rate_GBps():.1f} GB/s (256 MiB fp32 tensor copy, read + write)"
    return info


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "\\|")


@dataclass
class Report:
    name: str
    title: str
    command: str
    started: datetime
    load_start: tuple[float, float, float]
    machine: dict[str, str]
    label: str = ""
    sections: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    report_dir: Path = REPORT_DIR

    @classmethod
    def start(
        cls,
        name: str,
        title: str,
        args: argparse.Namespace | None = None,
        *,
        device: str = "cpu",
        bandwidth: bool = False,
        argv: list[str] | None = None,
    ) -> Report:
        """Record the date, command, machine and load before the benchmark runs. `args.quick` labels the
        run "quick"; `args.report_dir` is where it will be written."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"report name must be a plain file stem, got {name!r}")
        argv = sys.argv if argv is None else argv
        return cls(
            name=name,
            title=title,
            command="python " + shlex.join([os.path.relpath(argv[0]) if argv else name, *argv[1:]]),
            started=datetime.now(UTC),
            load_start=load_average(),
            machine=machine(device, bandwidth),
            label="quick" if getattr(args, "quick", False) else "",
            report_dir=getattr(args, "report_dir", None) or REPORT_DIR,
        )

    def add(self, section: str, **cells: object) -> None:
        """One row of `section`'s table; columns in the order they first appear."""
        self.sections.setdefault(section, []).append(cells)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self, ended: datetime, load_end: tuple[float, float, float]) -> str:
        load = " / ".join
        lines = [f"# {self.title}", ""]
        if self.label:
            lines += [f"**{self.label} run**: reduced sizes, for checking the benchmark, not a recorded result.", ""]
        lines += [
            f"- date: {self.started:%Y-%m-%d %H:%M} to {ended:%H:%M} UTC",
            f"- command: `{self.command}`",
            *(f"- {key}: {value}" for key, value in self.machine.items()),
            f"- load average (1, 5, 15 min): {load(f'{x:.2f}' for x in self.load_start)} at the start, "
            f"{load(f'{x:.2f}' for x in load_end)} at the end",
            "",
        ]
        for section, rows in self.sections.items():
            columns = list(dict.fromkeys(key for row in rows for key in row))
            lines += [f"## {section}", "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
            lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
            lines.append("")
        for text in self.notes:
            lines += [text, ""]
        return "\n".join(lines)

    def path(self) -> Path:
        """<name>-<date>[-label].md in the report folder; a second run the same day gets -2, -3, ..."""
        stem = f"{self.name}-{self.started:%Y-%m-%d}" + (f"-{self.label}" if self.label else "")
        path, n = self.report_dir / f"{stem}.md", 1
        while path.exists():
            n += 1
            path = self.report_dir / f"{stem}-{n}.md"
        return path

    def write(self) -> Path:
        """Write the report whole or not at all (temporary file, then rename)."""
        text = self.render(datetime.now(UTC), load_average())
        self.report_dir.mkdir(parents=True, exist_ok=True)
        path = self.path()
        fd, tmp = tempfile.mkstemp(dir=self.report_dir, prefix=f".{self.name}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        print(f"report: {path}")
        return path

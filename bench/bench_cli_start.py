"""What the `dsh` command costs to start: CPU of fresh processes and modules loaded, two trees.

Runs each command in fresh ``python -m dsh.cli`` processes with ``PYTHONPATH`` set to each
``--src`` tree in turn (alternated, so load drifts reach both alike) and prints the median CPU
(user+sys, from the child's rusage) and the number of modules ``python -X importtime`` lists.
``show-first`` stops the process after its first stdout line, as ``dsh show | head -1`` does.

    python -m bench.bench_cli_start --src OLD/src --src NEW/src --store sqlite:S10K \\
        --big sqlite:S300K [--runs 7]

The stores hold one session named ``bench`` (``bench.bench_cli`` builds them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def _env(src: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": src, "NO_COLOR": "1", "COLUMNS": "120"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def cpu_ms(src: str, args: list[str], *, first_line: bool = False) -> float:
    """User+sys CPU milliseconds of one fresh ``python -m dsh.cli ARGS`` process."""
    proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=_env(src))
    assert proc.stdout is not None
    if first_line:
        assert proc.stdout.readline(), args
        proc.stdout.close()  # what `| head -1` does: the command stops at its next write
    else:
        proc.stdout.read()
        proc.stdout.close()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return (usage.ru_utime + usage.ru_stime) * 1000


def modules(src: str, args: list[str]) -> int:
    """How many modules ``python -X importtime -m dsh.cli ARGS`` loads."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "dsh.cli", *args],
                          capture_output=True, text=True, env=_env(src), check=False)
    return sum(line.startswith("import time:") for line in done.stderr.splitlines()) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--big", required=True)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rows = {
        "dsh --version": (["--version"], False),
        "dsh ls": (["ls", "--store", args.store], False),
        "dsh show (10k events, whole)": (["show", "bench", "--store", args.store], False),
        "dsh show (300k, to the first line)": (["show", "bench", "--store", args.big], True),
        "dsh show --last 50 (300k)": (["show", "bench", "--store", args.big, "--last", "50"],
                                      False),
    }
    print(f"# load: {os.getloadavg()[0]:.1f} (1 min), medians of {args.runs}")
    print("| command | " + " | ".join(f"CPU ms, {s}" for s in args.src) +
          " | " + " | ".join(f"modules, {s}" for s in args.src) + " |")
    print("|---|" + "---:|" * (2 * len(args.src)))
    for label, (argv, first) in rows.items():
        times: dict[str, list[float]] = {s: [] for s in args.src}
        for _ in range(args.runs):
            for src in args.src:
                times[src].append(cpu_ms(src, argv, first_line=first))
        counts = [modules(src, argv) for src in args.src]
        print(f"| {label} | " + " | ".join(f"{statistics.median(times[s]):.0f}"
                                         for s in args.src) +
              " | " + " | ".join(str(c) for c in counts) + " |", flush=True)
    print(f"# load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

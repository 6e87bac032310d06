"""A restore point's packed surface read back: the inflate a resume pays for its node seqs.

Run: ``python -m bench.bench_unpack [--nodes 364000] [--runs 7] [--src DIR,DIR]``.

A restore point holding ``--nodes`` surface nodes (by default the 364k of an uncompacted
1M-event msg session) is encoded in both packed forms (``"zb:"``, one byte a difference, and
``"zd:"``, int64 differences; docs/formats.md#restore-points), and each measured run decodes
it with ``decode_restore_point`` in a fresh process: ``cpu_ms`` is the ``time.process_time``
of the decode and the first ``to_array`` (what a resume does with the nodes), ``warm_ms`` the
median of 31 more ``unpack`` (or ``unpack_narrow``) + ``to_array`` of the same bytes in that
process (the inflate alone, steadier). With ``--src``,
each listed source tree (a ``src`` folder of another checkout, its accelerator built) is put
first on ``PYTHONPATH`` in turn, runs alternating, so two commits compare on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import accumulate
from pathlib import Path

from bench.bench_write import header_lines, medians
from bench.fixtures import packed_point
from bench.workloads import existing_dir

_WARM_REPEATS = 31


def _point(nodes: int, form: str) -> bytes:
    """A restore point whose ``nodes`` surface seqs pack as ``form`` ("zb" or "zd")."""
    from dsh.session import NodeSeqs
    # rising by 1 .. 6 (a turn's messages between tool calls); "zd": one rise past 255 in
    # every 1,000, which no byte holds
    rises = random.Random(0).choices(range(1, 7), k=nodes)
    if form == "zd":
        rises[::1000] = [300] * len(rises[::1000])
    seqs = NodeSeqs(accumulate(rises))
    return packed_point(seqs, seqs[-1] + 1)


def _child(path: Path) -> None:
    import dsh
    from dsh.persistence import _restore_point as rp
    from dsh.session import NodeSeqs
    data = path.read_bytes()
    started = time.process_time()
    nodes = rp.decode_restore_point(data, session_id="s", backend="sqlite").state.nodes
    seqs = nodes.to_array()  # type: ignore[attr-defined]  # NodeSeqs: the packed form
    cpu_ms = (time.process_time() - started) * 1000
    narrow = nodes.pack_narrow()  # type: ignore[attr-defined]  # the bytes read back, kept
    packed, unpack = (nodes.pack(), NodeSeqs.unpack) if narrow is None \
        else (narrow, NodeSeqs.unpack_narrow)  # type: ignore[attr-defined]
    count = seqs[-1] + 1  # eventCount, as _point wrote it
    warm = []
    for _ in range(_WARM_REPEATS):
        started = time.process_time()
        unpack(packed, count).to_array()
        warm.append((time.process_time() - started) * 1000)
    print(json.dumps({"cpu_ms": cpu_ms, "warm_ms": statistics.median(warm),
                      "nodes": len(seqs), "dsh": dsh.__file__}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=364_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--src", default="", help="source trees to compare, comma separated")
    parser.add_argument("--dir", type=existing_dir, default=None)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child)
        return
    trees = [tree for tree in args.src.split(",") if tree] or [""]
    header_lines(f"Packed surface read back: {args.nodes:,} nodes, decode + first to_array")
    print("| form | source | fresh process: decode + to_array, cpu ms | same process: unpack + "
          "to_array, cpu ms | runs |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        for form in ("zb", "zd"):
            path = Path(work) / f"{form}.ckpt"
            path.write_bytes(_point(args.nodes, form))
            runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
            for _ in range(args.runs):
                for tree in trees:  # alternating: load drifts alike for each tree
                    env = dict(os.environ)
                    if tree:
                        env["PYTHONPATH"] = os.pathsep.join(
                            part for part in (tree, str(Path.cwd()), env.get("PYTHONPATH"))
                            if part)
                    proc = subprocess.run(
                        [sys.executable, "-m", "bench.bench_unpack", "--child", str(path)],
                        capture_output=True, text=True, env=env, check=True)
                    result = json.loads(proc.stdout.splitlines()[-1])
                    if tree and not result["dsh"].startswith(str(Path(tree).resolve())):
                        raise SystemExit(f"{tree}: the child imported dsh from {result['dsh']}")
                    runs[tree].append(result)
            for tree in trees:
                figures = medians(runs[tree])
                print(f"| {form} | {tree or 'installed'} | {figures['cpu_ms']:.2f} "
                      f"| {figures['warm_ms']:.2f} | {args.runs} |")


if __name__ == "__main__":
    main()

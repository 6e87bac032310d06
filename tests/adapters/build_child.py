"""Child of the build-path equivalence test: the events random ``add_items`` batches build.

``python build_child.py EXAMPLES`` prints one JSON line: for each of EXAMPLES batch sequences
Hypothesis draws (derandomized: the same sequences in every process, whatever the
accelerator), the outcome of each batch as :func:`outcomes` gives it. Run with and without
``DSH_NO_SPEEDUPS=1`` the two lines must be equal (tests/adapters/test_openai_agents_build.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hypothesis import HealthCheck, given, settings

from tests.adapters.build_paths import outcomes
from tests.strategies import responses_batches


def main(count: int) -> None:
    found: list[Any] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(responses_batches())
    def collect(batches: list[list[dict[str, Any]]]) -> None:
        found.append([batches, outcomes(batches)])

    collect()
    print(json.dumps(found))


if __name__ == "__main__":
    main(int(sys.argv[1]))

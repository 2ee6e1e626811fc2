"""Under `python -O` asserts vanish: no work may hide inside one (issue 11)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orcasim.run import run_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "regression" / "memory.yaml"
OVERRIDES = ("workload.num_requests=120",)
SCRIPT = """
import json, sys, warnings
warnings.simplefilter("ignore")
from orcasim.run import run_scenario
result = run_scenario(sys.argv[1], tuple(sys.argv[2:]))
print(json.dumps({n: r.summary for n, r in result.systems.items()}))
"""


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_paged_scenario_gives_the_same_summary_under_python_O() -> None:
    # Every paged kind and both preemption modes, with preemptions (a tight cache).
    done = subprocess.run([sys.executable, "-O", "-c", SCRIPT, str(SCENARIO), *OVERRIDES],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    optimized = json.loads(done.stdout)
    expected = {n: r.summary for n, r in run_scenario(SCENARIO, OVERRIDES).systems.items()}
    # Compared as JSON text: NaN (a run too short to judge saturation) equals itself there.
    assert json.dumps(optimized, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert any(s["preemptions"] > 0 for s in optimized.values())

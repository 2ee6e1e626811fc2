"""Run a script as on a CPU without the SIMD code numpy dispatches to here (AVX-512...):
NPY_DISABLE_CPU_FEATURES turns it off, so one machine can compare what two would compute."""

from __future__ import annotations

import os
import subprocess
import sys


def simd_features() -> list[str]:
    """The CPU features numpy dispatches to on this machine beyond its build's baseline."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]


def stdout_with_and_without_simd(script: str) -> tuple[str, str]:
    """`script`'s output run as this machine runs it and with numpy's dispatched features off
    (on a machine without any, the same run twice)."""
    def run(**env: str) -> str:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              check=True, env={**os.environ, **env})
        return done.stdout.strip()

    return run(), run(NPY_DISABLE_CPU_FEATURES=" ".join(simd_features()))

"""The warm-up and the measured window: which requests a summary counts, what its throughput,
utilisation and Little's law read over the window by hand, and the saturation flag at loads
below and above a server's capacity, on every scheduler kind, a fleet and a disaggregated
cluster.

Hand-computed runs: one request at a time (batch size 1, one output token, a constant
prompt), so every request is one iteration of D = 0.5 s (`md1`'s shape, deterministic
here): constant arrivals at k s for k = 1..N finish at k + D, and nothing ever waits.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from orcasim import run_scenario
from orcasim.run import make_requests
from tests.conftest import make_scenario

EXACT_RTOL = 1e-12
SERVICE_S = 0.5
N = 40  # arrivals at 1, 2, ..., 40 s
SCHEDULERS: dict[str, dict[str, Any]] = {
    "request_level": {"kind": "request_level", "max_batch_size": 1},
    "iteration_level": {"kind": "iteration_level", "max_batch_size": 1},
    "paged": {"kind": "paged", "max_num_seqs": 1},
    "chunked": {"kind": "chunked", "max_num_seqs": 1},
}


def one_at_a_time(scheduler: dict[str, Any], arrival: dict[str, Any], num_requests: int,
                  warmup_s: float, seed: int = 0, **changes: Any) -> Any:
    """One system serving one request at a time, each one iteration of SERVICE_S."""
    sc = make_scenario(**{
        "seed": seed, "warmup_s": warmup_s, "workload.num_requests": num_requests,
        "workload.arrival": arrival,
        "workload.prompt_tokens": {"kind": "constant", "value": 10},
        "workload.output_tokens": {"kind": "constant", "value": 1},
        "cost": {"kind": "linear", "base_s": SERVICE_S, "per_token_s": 0.0},
        "systems": [{"name": "s", "scheduler": scheduler, **changes}]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_scenario(sc).systems["s"]


def test_constant_arrivals_land_on_their_times() -> None:
    """The k-th of constant arrivals at 10 req/s is at k / 10 s, so a warm-up of 10 s keeps
    the request at 10 s (arrivals at or after it count). Summing the gaps put it at
    9.99999999999998 s: 200 of 300 requests were measured at 10 req/s, where 7 and 3 req/s
    (whose sums rounded up) measured the 231 and 271 the rule says."""
    for rate_per_s in (10.0, 7.0, 3.0, 100.0):
        sc = make_scenario(**{"workload.num_requests": 3000, "warmup_s": 10.0,
                              "workload.arrival": {"kind": "constant", "rate_per_s": rate_per_s}})
        arrival_s = make_requests(sc).arrival_s
        assert arrival_s.tolist() == (np.arange(1, 3001) / rate_per_s).tolist()
        assert int((arrival_s >= 10.0).sum()) == 3000 - round(10 * rate_per_s) + 1

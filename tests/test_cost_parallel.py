"""Communication costs of tensor and pipeline parallelism."""

from __future__ import annotations

import numpy as np
import pytest

from orcasim.cost import Batch
from orcasim.cost.catalog import HardwareConfig
from orcasim.cost.parallel import (
    Link,
    pipeline_link,
    ring_all_reduce_s,
    send_recv_s,
    tensor_parallel_link,
)
from tests.test_cost_roofline import roofline


def test_ring_all_reduce_by_hand() -> None:
    link = Link(bandwidth_bytes_per_s=100e9, latency_s=10e-6)
    # 8 ranks: 2 * 7/8 of 1 MB crosses each link.
    assert float(ring_all_reduce_s(1e6, 8, link)) == pytest.approx(10e-6 + 1.75 * 1e6 / 100e9)
    assert float(ring_all_reduce_s(1e6, 2, link)) == pytest.approx(10e-6 + 1.0 * 1e6 / 100e9)
    assert float(ring_all_reduce_s(1e6, 1, link)) == 0.0
    assert float(send_recv_s(1e6, link)) == pytest.approx(10e-6 + 1e-5)


def test_links_follow_the_placement() -> None:
    inside = HardwareConfig(gpu="a100-40gb", tensor_parallel=8)
    assert tensor_parallel_link(inside, 1.0, 0.0).bandwidth_bytes_per_s == 300e9  # NVLink, one way
    across = HardwareConfig(gpu="a100-40gb", tensor_parallel=8, pipeline_parallel=2)
    assert pipeline_link(across, 1.0, 0.0).bandwidth_bytes_per_s == 25e9  # HDR InfiniBand per GPU
    assert pipeline_link(HardwareConfig(gpu="a100-40gb", tensor_parallel=4, pipeline_parallel=2), 1.0, 0.0) \
        .bandwidth_bytes_per_s == 300e9


def test_tensor_parallel_adds_two_all_reduces_per_layer() -> None:
    tp1, tp8 = roofline("gpt3-175b", "a100-80gb", tp=1), roofline("gpt3-175b", "a100-80gb", tp=8)
    n = 512
    expected = 2 * 96 * ring_all_reduce_s(n * 12288 * 2, 8, tp8.tp_link)
    assert float(tp8.tp_all_reduce_s(n)) == pytest.approx(float(expected))
    assert float(tp1.tp_all_reduce_s(n)) == 0.0
    batch = Batch(np.array([n]), np.array([n]))
    assert tp8.iteration_time_s(batch) < tp1.iteration_time_s(batch) / 4  # compute divides by 8


def test_pipeline_parallel_adds_one_send_per_boundary() -> None:
    pp1 = roofline("gpt3-175b", "a100-40gb", tp=8, pp=1)
    pp4 = roofline("gpt3-175b", "a100-40gb", tp=8, pp=4)
    batch = Batch(np.array([300, 1]), np.array([300, 700]))
    sends = 3 * send_recv_s(301 * 12288 * 2, pp4.pp_link)
    assert pp4.iteration_time_s(batch) - pp1.iteration_time_s(batch) == pytest.approx(float(sends))


@pytest.mark.parametrize(("tp", "links"), [(2, 1), (4, 3), (8, 7)])
def test_a_full_mesh_gives_a_tp_group_one_link_per_peer(tp: int, links: int) -> None:
    """MI300X's Infinity Fabric is 7 point-to-point links of 64 GB/s a way (AMD's RCCL note):
    a TP-2 pair shares one of them, not the 448 GB/s of all seven, which a switch (NVSwitch)
    would give any peer. TP 2 priced its all-reduces 7 times too fast."""
    from orcasim.cost.catalog import HardwareConfig
    from orcasim.cost.parallel import pipeline_link, tensor_parallel_link

    mesh = HardwareConfig(gpu="mi300x", tensor_parallel=tp)
    assert tensor_parallel_link(mesh, 1.0, 0.0).bandwidth_bytes_per_s == pytest.approx(links * 64e9)
    assert pipeline_link(mesh, 1.0, 0.0).bandwidth_bytes_per_s == pytest.approx(64e9)
    switch = HardwareConfig(gpu="h100-80gb", tensor_parallel=tp)
    assert tensor_parallel_link(switch, 1.0, 0.0).bandwidth_bytes_per_s == 450e9

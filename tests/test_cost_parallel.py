"""Communication costs of tensor and pipeline parallelism."""

from __future__ import annotations

import numpy as np
import pytest

from orcasim.cost import Batch
from orcasim.cost.catalog import HardwareConfig
from orcasim.cost.parallel import (
    Link,
    pipeline_links,
    ring_all_reduce_s,
    send_recv_s,
    stage_boundaries_cross_nodes,
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
    assert [link.bandwidth_bytes_per_s for link in pipeline_links(across, 1.0, 0.0)] == [25e9]  # HDR IB a GPU
    inside = HardwareConfig(gpu="a100-40gb", tensor_parallel=4, pipeline_parallel=2)
    assert [link.bandwidth_bytes_per_s for link in pipeline_links(inside, 1.0, 0.0)] == [300e9]


@pytest.mark.parametrize(("tp", "pp", "crossing"), [
    (8, 2, [0]), (8, 4, [0, 1, 2]), (4, 2, []), (4, 4, [1]), (2, 8, [3]), (1, 16, [7]),
    (16, 2, [0]), (3, 4, [1, 2]),
])
def test_only_boundaries_between_nodes_cross_the_network(tp: int, pp: int, crossing: list[int]) -> None:
    """Stages fill 8-GPU nodes in rank order (TP fastest): TP 1 x PP 16 crosses at one
    boundary of 15, between GPU 7 and 8, where every boundary went over InfiniBand (its
    prefill priced 5% slow); TP 3 stages straddle nodes (GPUs 3-5 and 6-8 at the second
    boundary, 6-8 and 9-11 at the third)."""
    hw = HardwareConfig(gpu="a100-40gb", tensor_parallel=tp, pipeline_parallel=pp)
    crosses = stage_boundaries_cross_nodes(hw)
    assert [k for k, c in enumerate(crosses) if c] == crossing
    links = pipeline_links(hw, 1.0, 0.0)
    assert [link.bandwidth_bytes_per_s == 25e9 for link in links] == crosses


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
    sends = 3 * send_recv_s(301 * 12288 * 2, pp4.pp_links[0])
    assert pp4.iteration_time_s(batch) - pp1.iteration_time_s(batch) == pytest.approx(float(sends))
    # TP 4 x PP 4 on 8-GPU nodes: two boundaries inside a node, the middle one across.
    tp4 = roofline("gpt3-175b", "a100-40gb", tp=4, pp=4)
    size = 301 * 12288 * 2
    inside, across = tp4.pp_links[0], tp4.pp_links[1]
    assert tp4.pp_links == [inside, across, inside] and inside != across
    want = 2 * send_recv_s(size, inside) + send_recv_s(size, across)
    assert float(tp4.pipeline_sends_s(301)) == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize(("tp", "links"), [(2, 1), (4, 3), (8, 7)])
def test_a_full_mesh_gives_a_tp_group_one_link_per_peer(tp: int, links: int) -> None:
    """MI300X's Infinity Fabric is 7 point-to-point links of 64 GB/s a way (AMD's RCCL note):
    a TP-2 pair shares one of them, not the 448 GB/s of all seven, which a switch (NVSwitch)
    would give any peer. TP 2 priced its all-reduces 7 times too fast."""
    from orcasim.cost.catalog import HardwareConfig
    from orcasim.cost.parallel import pipeline_links, tensor_parallel_link

    mesh = HardwareConfig(gpu="mi300x", tensor_parallel=tp)
    assert tensor_parallel_link(mesh, 1.0, 0.0).bandwidth_bytes_per_s == pytest.approx(links * 64e9)
    two_stages = HardwareConfig(gpu="mi300x", pipeline_parallel=2)  # one GPU a stage
    assert pipeline_links(two_stages, 1.0, 0.0)[0].bandwidth_bytes_per_s == pytest.approx(64e9)
    switch = HardwareConfig(gpu="h100-80gb", tensor_parallel=tp)
    assert tensor_parallel_link(switch, 1.0, 0.0).bandwidth_bytes_per_s == 450e9

"""Communication costs of tensor and pipeline parallelism.

Tensor parallelism (Megatron, Shoeybi et al. 2019) all-reduces the layer output twice per
layer: after the attention output projection and after the MLP down projection, each of
tokens x hidden x dtype bytes. Pipeline parallelism sends the same activation from one
stage to the next.

The ring all-reduce moves 2(n-1)/n of the message over each link (a reduce-scatter then an
all-gather, Patarasuk & Yuan 2009), so its time is latency + 2(n-1)/n * bytes / bandwidth.

Expert parallelism moves tokens with two all-to-alls per MoE layer (dispatch to the
experts' ranks, combine back). A rank's message is spread evenly over the ranks (its own
share stays): what goes to ranks of its node crosses NVLink, the rest the network, both
at once, so the slower of the two sets the time (DeepEP's kernels forward the two domains
concurrently, deepseek-ai/DeepEP).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orcasim.cost.catalog import GpuSpec, HardwareConfig


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a link: achieved bandwidth and a fixed per-message latency."""

    bandwidth_bytes_per_s: float
    latency_s: float


def ring_all_reduce_s(size_bytes: np.ndarray | float, num_ranks: int, link: Link) -> np.ndarray:
    """Time of a ring all-reduce of `size_bytes` over `num_ranks` (zero for one rank)."""
    size = np.asarray(size_bytes, dtype=np.float64)
    if num_ranks <= 1:
        return np.zeros_like(size)
    factor = 2.0 * (num_ranks - 1) / num_ranks
    return link.latency_s + factor * size / link.bandwidth_bytes_per_s


def send_recv_s(size_bytes: np.ndarray | float, link: Link) -> np.ndarray:
    """Time to send `size_bytes` point to point."""
    return link.latency_s + np.asarray(size_bytes, dtype=np.float64) / link.bandwidth_bytes_per_s


def nvlink_one_way_bytes_per_s(gpu: GpuSpec, peers: int) -> float:
    """A GPU's nominal bandwidth inside its node to `peers` others, one way. The datasheet
    figure counts both directions; a ring step (or a send) uses one. Through a switch
    (NVSwitch) a GPU reaches any peer at its whole bandwidth; in a full mesh (MI300X's
    Infinity Fabric: 7 point-to-point links of 64 GB/s a way) it has one link to each peer,
    so a group of 2 has one link, not seven."""
    one_way = gpu.nvlink_bandwidth_bytes_per_s / 2.0
    if gpu.mesh_links is not None:
        one_way *= min(max(peers, 1), gpu.mesh_links) / gpu.mesh_links
    return one_way


def _nvlink(gpu: GpuSpec, efficiency: float, latency_s: float, peers: int) -> Link:
    """A GPU's link inside its node to `peers` others (`nvlink_one_way_bytes_per_s`)."""
    return Link(nvlink_one_way_bytes_per_s(gpu, peers) * efficiency, latency_s)


def _network(gpu: GpuSpec, efficiency: float, latency_s: float) -> Link:
    return Link(gpu.node_network_bytes_per_s * efficiency, latency_s)


def tensor_parallel_link(hw: HardwareConfig, efficiency: float, latency_s: float) -> Link:
    """TP groups live inside a node (NVLink) unless they are wider than a node."""
    if hw.tensor_parallel <= hw.gpu.gpus_per_node:
        return _nvlink(hw.gpu, efficiency, latency_s, hw.tensor_parallel - 1)
    return _network(hw.gpu, efficiency, latency_s)


def stage_boundaries_cross_nodes(hw: HardwareConfig) -> list[bool]:
    """Whether each stage boundary's sends leave a node.

    Stages fill the nodes in order, `gpus_per_stage` GPUs each: vLLM's and Megatron's rank
    order, tensor parallelism varying fastest (vLLM's `initialize_model_parallel` reshapes
    the ranks to (..., pipeline, tensor)). Rank i of a stage sends to rank i of the next, so
    a boundary crosses where any such pair sits in two nodes: every boundary of Orca's one
    stage a node (TP 8 x PP 2), one of the 15 of TP 1 x PP 16 on 8-GPU nodes, none inside
    one node.
    """
    per_stage, per_node = hw.gpus_per_stage, hw.gpu.gpus_per_node
    return [any((k * per_stage + i) // per_node != ((k + 1) * per_stage + i) // per_node
                for i in range(per_stage))
            for k in range(hw.pipeline_parallel - 1)]


def pipeline_links(hw: HardwareConfig, efficiency: float, latency_s: float) -> list[Link]:
    """Each stage boundary's link: NVLink to one peer inside a node, the network across."""
    nvlink = _nvlink(hw.gpu, efficiency, latency_s, 1)  # a send to the next stage: one peer
    network = _network(hw.gpu, efficiency, latency_s)
    return [network if crosses else nvlink for crosses in stage_boundaries_cross_nodes(hw)]


def all_to_all_s(size_bytes: np.ndarray | float, num_ranks: int, ranks_per_node: int,
                 intra: Link, inter: Link) -> np.ndarray:
    """Time of an all-to-all in which the busiest rank moves `size_bytes` (zero for one rank)."""
    size = np.asarray(size_bytes, dtype=np.float64)
    if num_ranks <= 1:
        return np.zeros_like(size)
    in_node = min(num_ranks, ranks_per_node)
    intra_s = size * ((in_node - 1) / num_ranks) / intra.bandwidth_bytes_per_s
    inter_s = size * ((num_ranks - in_node) / num_ranks) / inter.bandwidth_bytes_per_s
    latency_s = inter.latency_s if num_ranks > in_node else intra.latency_s
    return latency_s + np.maximum(intra_s, inter_s)


def expert_parallel_links(hw: HardwareConfig, efficiency: float, latency_s: float) -> tuple[Link, Link]:
    """NVLink inside a node (to the node's other ranks), the network between nodes."""
    peers = min(hw.expert_parallel, hw.gpu.gpus_per_node) - 1
    return _nvlink(hw.gpu, efficiency, latency_s, peers), _network(hw.gpu, efficiency, latency_s)

"""Communication of tensor and expert parallelism, priced with an alpha-beta model on the interconnect."""
from __future__ import annotations

from .profile import HardwareProfile


def all_reduce_seconds(nbytes: float, ranks: int, hw: HardwareProfile) -> float:
    """Ring all-reduce: 2(p-1)/p of the data crosses each link, in 2(p-1) latency-bound steps."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    bandwidth = hw.interconnect_bandwidth_gbps * 1e9 * hw.efficiency.communication
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * hw.interconnect_latency_us * 1e-6


def all_to_all_seconds(nbytes_per_rank: float, ranks: int, hw: HardwareProfile) -> float:
    """Each rank sends (p-1)/p of its data to the others; one latency per peer exchange round."""
    if ranks <= 1 or nbytes_per_rank <= 0:
        return 0.0
    bandwidth = hw.interconnect_bandwidth_gbps * 1e9 * hw.efficiency.communication
    return (ranks - 1) / ranks * nbytes_per_rank / bandwidth + (ranks - 1) * hw.interconnect_latency_us * 1e-6


class LayoutError(ValueError):
    """A layout the devices cannot run (e.g. more than one node on a profile with no scale-out network)."""


def nodes_spanned(ranks: int, hw: HardwareProfile) -> int:
    """Scale-up domains (NVLink / Infinity Fabric: a node, or an NVL72 rack) a group of `ranks` consecutive GPUs
    occupies; more than one needs the profile's scale-out network."""
    domain = hw.scale_up_gpus
    nodes = -(-ranks // domain)
    if nodes > 1 and hw.scale_out_bandwidth_gbps <= 0:
        raise LayoutError(f"{hw.name}: a group of {ranks} GPUs spans {nodes} interconnect domains of {domain}, and "
                          f"the profile has no 'scale_out' network to price it on")
    return nodes


def _scale_out_bandwidth(hw: HardwareProfile) -> float:
    return hw.scale_out_bandwidth_gbps * 1e9 * hw.efficiency.communication


def cross_node_all_reduce_seconds(nbytes: float, ranks: int, hw: HardwareProfile) -> float:
    """The inter-node part of a hierarchical all-reduce (reduce-scatter in the node, a ring between nodes on
    each GPU's 1/g shard, all-gather in the node); the intra-node parts are priced by the caller. 0 within a node."""
    nodes = nodes_spanned(ranks, hw)
    if nodes <= 1 or nbytes <= 0:
        return 0.0
    shard = nbytes / min(ranks, hw.scale_up_gpus)
    return 2 * (nodes - 1) / nodes * shard / _scale_out_bandwidth(hw) + 2 * (nodes - 1) * hw.scale_out_latency_us * 1e-6


def group_all_to_all_seconds(nbytes_per_rank: float, ranks: int, hw: HardwareProfile) -> float:
    """All-to-all over a group that may span nodes: the share bound for other nodes crosses the scale-out
    network, the rest the interconnect; both run at once and the slower sets the time."""
    nodes = nodes_spanned(ranks, hw)
    if nodes <= 1:
        return all_to_all_seconds(nbytes_per_rank, ranks, hw)
    local = min(ranks, hw.scale_up_gpus)
    intra = all_to_all_seconds(nbytes_per_rank * local / ranks, local, hw)
    remote = (ranks - local) / ranks * nbytes_per_rank / _scale_out_bandwidth(hw) + \
        (nodes - 1) * hw.scale_out_latency_us * 1e-6
    return max(intra, remote)


def point_to_point_seconds(nbytes: float, hw: HardwareProfile, cross_node: bool) -> float:
    """One send between pipeline stages, inside a node or across the scale-out network."""
    if nbytes <= 0:
        return 0.0
    if cross_node:
        nodes_spanned(hw.scale_up_gpus + 1, hw)     # refuses when the profile has no scale-out network
        return nbytes / _scale_out_bandwidth(hw) + hw.scale_out_latency_us * 1e-6
    return nbytes / (hw.interconnect_bandwidth_gbps * 1e9 * hw.efficiency.communication) + \
        hw.interconnect_latency_us * 1e-6

"""Alpha-beta model of data-parallel scaling, used by tools/scaling_report.

Communication per step is one allreduce of the gradient, S bytes (S = grad_bytes * parameters;
4 bytes per parameter for fp32 gradients). A ring allreduce over p ranks, each sending to its
neighbour over a link of latency alpha and bandwidth beta, takes

    ring(p, S, beta) = 2 (p-1) alpha + 2 (p-1)/p * S / beta        (0 for p = 1)

(p-1 reduce-scatter steps plus p-1 allgather steps, each moving S/p bytes per rank).

Topology: `nodes` nodes of G ranks. Inside a node the per-rank link is the intra-node bandwidth
B_intra (NVLink class). The node's network bandwidth is B_node = links_per_node * link_gbps / 8.

  hierarchical (default, what NCCL-style topology-aware collectives achieve):
      reduce-scatter inside the node over G ranks, then G concurrent rings across the N nodes
      (rank i of every node owns shard i of S/G bytes; the G rings share B_node, so each gets
      B_node/G and moves S/G), then allgather inside the node:
      T = ring(G, S, B_intra) + ring(N, S, B_node)
        = 2(G-1) alpha + 2(G-1)/G S/B_intra + 2(N-1) alpha + 2(N-1)/N S/B_node
  flat (one ring over all p = N*G ranks, every rank's traffic crossing the node's NICs: the
      pessimistic bound; each rank gets B_node/G on the network):
      T = ring(p, S, beta),  beta = B_intra for N = 1, min(B_intra, B_node/G) for N > 1

Step time (no overlap by default; a fraction `overlap` of the allreduce can hide behind compute,
but never more than the compute time):

    t_c(p)  = t_compute                 weak scaling (constant per-rank work)
            = t_compute * p0 / p        strong scaling (constant global batch, perfect split)
    T(p)    = t_c(p) + comm(p) - min(overlap * comm(p), t_c(p))
    eff(p)  = T_1 / T(p)           (weak)   = T_1 / (p T(p))  (strong), T_1 the comm-free time
            = t_c(p) / T(p)        in both cases

where t_compute is the measured compute + data time per step of the smallest run (p0 ranks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("hierarchical", "flat")


@dataclass(frozen=True)
class Network:
    latency_s: float = 2e-6   # alpha: per message step
    intra_Bps: float = 300e9  # per-rank intra-node bandwidth (bytes/s), NVLink class
    node_Bps: float = 100e9   # network bandwidth of one node (bytes/s): 4 x 200 Gb/s HDR IB

    @staticmethod
    def from_options(latency_us=2.0, intra_GBps=300.0, link_gbps=200.0, links_per_node=4):
        return Network(latency_s=latency_us * 1e-6, intra_Bps=intra_GBps * 1e9,
                       node_Bps=links_per_node * link_gbps * 1e9 / 8.0)


def ring_allreduce_s(p: int, nbytes: float, alpha: float, beta: float) -> float:
    """Ring allreduce of nbytes over p ranks: 2(p-1) alpha + 2 (p-1)/p nbytes / beta."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2.0 * (p - 1) / p * nbytes / beta


def allreduce_s(nodes: int, ranks_per_node: int, nbytes: float, net: Network,
                algorithm: str = "hierarchical") -> float:
    """Allreduce time of nbytes over `nodes` nodes of `ranks_per_node` ranks each."""
    if nodes < 1 or ranks_per_node < 1:
        raise ValueError("nodes and ranks_per_node must be >= 1")
    g, n = ranks_per_node, nodes
    if algorithm == "hierarchical":
        return (ring_allreduce_s(g, nbytes, net.latency_s, net.intra_Bps) +
                ring_allreduce_s(n, nbytes, net.latency_s, net.node_Bps))
    if algorithm == "flat":
        beta = net.intra_Bps if n == 1 else min(net.intra_Bps, net.node_Bps / g)
        return ring_allreduce_s(n * g, nbytes, net.latency_s, beta)
    raise ValueError(f"unknown allreduce algorithm '{algorithm}' (use {' or '.join(ALGORITHMS)})")


def topology(p: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, ranks per node) for p ranks: one partly filled node below G, else full nodes."""
    if p <= gpus_per_node:
        return 1, p
    return math.ceil(p / gpus_per_node), gpus_per_node


def rank_counts(max_ranks: int, gpus_per_node: int) -> list[int]:
    """1, 2, 4, ... below one node, then G, 2G, 4G, ... (full nodes) up to max_ranks, plus
    max_ranks rounded down to full nodes."""
    out = []
    p = 1
    while p < gpus_per_node and p <= max_ranks:
        out.append(p)
        p *= 2
    p = gpus_per_node
    while p <= max_ranks:
        out.append(p)
        p *= 2
    last = max_ranks if max_ranks < gpus_per_node else (max_ranks // gpus_per_node) * gpus_per_node
    if last >= 1 and last not in out:
        out.append(last)
    return sorted(set(out))


@dataclass(frozen=True)
class Prediction:
    p: int
    nodes: int
    ranks_per_node: int
    compute_s: float    # t_c(p)
    allreduce_s: float  # full allreduce time
    exposed_s: float    # part of it not hidden behind compute
    step_s: float
    efficiency: float


def predict(p: int, nodes: int, ranks_per_node: int, *, t_compute: float, p0: int, mode: str,
            nbytes: float, net: Network, algorithm: str = "hierarchical",
            overlap: float = 0.0) -> Prediction:
    """Predicted step time and parallel efficiency for p = nodes * ranks_per_node ranks."""
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be strong or weak, not '{mode}'")
    t_c = t_compute if mode == "weak" else t_compute * p0 / p
    comm = allreduce_s(nodes, ranks_per_node, nbytes, net, algorithm)
    exposed = comm - min(overlap * comm, t_c)
    step = t_c + exposed
    eff = t_c / step if step > 0 else 1.0
    return Prediction(p, nodes, ranks_per_node, t_c, comm, exposed, step, eff)

"""A serving cluster under a request stream: N data-parallel engine instances (serving/engine.py), each
with its own GPU prefix cache under one engine's rules (serving/kv_cache.py), optionally sharing one CPU
prefix pool (serving/cpu_pool.py), fed by a router (serving/routing.py) from an arrival source
(serving/arrivals.py). Events are processed in time order: the next arrival, or the next step of the
instance whose clock is earliest.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from .arrivals import OpenLoopArrivals
from .cpu_pool import CpuPool
from .engine import Engine, Seq
from .kv_cache import make_cache
from .metrics import SimResult
from .routing import make_router
from .server_intake import ServerIntake
from .step_cost import StepCost
from .workload import SimRequest

__all__ = ["ServerConfig", "SimResult", "StepCost", "simulate"]


@dataclass(frozen=True)
class ServerConfig:
    block_size: int = 16
    gpu_blocks: int = 10000           # per instance, vLLM's null block included
    cpu_blocks: int = 0               # one pool shared by all instances
    max_prefill_tokens: int = 8192    # tokens per step (vLLM's max_num_batched_tokens), decode tokens included
    max_running: int = 256
    prefix_caching: bool = True
    block_bytes: float = 0.0
    host_link_bytes_per_s: float = 64e9
    cache_policy: str = "vllm"
    instances: int = 1
    routing: str = "round-robin"
    overlap_store: bool = True        # the GPU->CPU write-through runs beside compute, as both engines do it
    gpus_per_instance: int = 1
    api_server: bool = True           # each instance takes requests in through its HTTP server's one process
    chat_requests: bool = True        # as chat completions, each rendered by the server (StepCost.intake_s)
    reserve_output: bool = False      # admit only with the whole sequence's blocks (TensorRT-LLM GUARANTEED_NO_EVICT)

    @property
    def gpus(self) -> int:
        return self.instances * self.gpus_per_instance


PROGRESS_EVERY = 16   # engine step calls between progress reports
INF = float("inf")


def _earliest(engines: list[Engine]) -> Engine | None:
    """The instance with work whose clock is earliest (the lowest index on a tie)."""
    best = None
    for e in engines:
        if (e.waiting or e.running) and (best is None or e.clock < best.clock):
            best = e
    return best


def simulate(requests: list[SimRequest], cost: StepCost, config: ServerConfig, arrivals=None,
             on_progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Run the cluster until every request finishes; on_progress(done, total) hears how many have, now and then."""
    bs = config.block_size
    res = SimResult()
    cpu = CpuPool(config.cpu_blocks) if config.cpu_blocks and config.prefix_caching else None
    arrivals = arrivals or OpenLoopArrivals(requests)
    engines = [Engine(i, make_cache(config.cache_policy, config.gpu_blocks, bs, config.prefix_caching), cost,
                      config, cpu, res, on_finish=arrivals.on_finish) for i in range(config.instances)]
    router = make_router(config.routing)
    fits = engines[0].cache.capacity_blocks
    # an instance's HTTP server takes each request in (StepCost.intake_s) in one event loop that shares its time
    # among the requests it holds (serving/server_intake.py): a burst enters the engine together
    intake_s = cost.intake_s(config.chat_requests) if config.api_server else 0.0
    servers = [ServerIntake(intake_s) for _ in engines]
    entering: list = []            # heap of (a server's next departure, order, engine index, that server's version)
    version = [0] * len(engines)   # an arrival moves its server's next departure: older heap entries are stale
    order = 0

    def schedule(i: int) -> None:
        nonlocal order
        version[i] += 1
        order += 1
        if (t := servers[i].next_departure()) is not None:
            heapq.heappush(entering, (t, order, i, version[i]))
    last_t, ticks = 0.0, 0
    while True:
        engine = _earliest(engines)
        t_arrival = arrivals.next_time()
        t_entry = entering[0][0] if entering else None
        if t_entry is not None and (t_arrival is None or t_entry <= t_arrival) and \
                (engine is None or t_entry <= engine.clock):
            _, _, i, v = heapq.heappop(entering)
            if v == version[i]:
                for seq in servers[i].depart(t_entry):
                    engines[i].enqueue(seq, t_entry)
                schedule(i)
            continue
        if t_arrival is None and engine is None:
            break
        if t_arrival is not None and (engine is None or t_arrival <= engine.clock):
            req = arrivals.pop()
            if config.prefix_caching:
                req.hash_blocks(bs)
            if -(-(req.prompt_tokens + req.output_tokens) // bs) > fits:   # longer than a whole GPU cache
                res.rejected_ids.append(req.rid)
                continue
            seq = Seq(req, req.block_hashes if config.prefix_caching else [])
            target = router(engines, seq, [e.load + len(s) for e, s in zip(engines, servers)])
            if intake_s > 0:
                servers[target.index].arrive(t_arrival, seq)
                schedule(target.index)
            else:
                target.enqueue(seq, t_arrival)
            continue
        if cpu is not None and engine.clock > last_t:
            res.cpu_block_s += len(cpu) * (engine.clock - last_t)
            last_t = engine.clock
        engine.step(min(t_arrival if t_arrival is not None else INF, t_entry if t_entry is not None else INF))
        ticks += 1
        if on_progress is not None and ticks % PROGRESS_EVERY == 0:
            on_progress(len(res.records) + len(res.rejected_ids), len(requests))
        if cpu is not None:
            res.cpu_blocks_peak = max(res.cpu_blocks_peak, len(cpu))
    if on_progress is not None:
        on_progress(len(res.records) + len(res.rejected_ids), len(requests))
    res.makespan_s = max(e.clock for e in engines)
    for e in engines:
        e._integrate(res.makespan_s)
        res.evicted_blocks += e.cache.evicted_blocks
        res.allocated_blocks += e.cache.allocated_blocks
    res.instance_requests = [e.requests for e in engines]
    if cpu is not None:
        res.cpu_block_s += len(cpu) * (res.makespan_s - last_t)
        res.cpu_stored_blocks, res.cpu_dropped_blocks = cpu.stored_blocks, cpu.dropped_blocks
    return res

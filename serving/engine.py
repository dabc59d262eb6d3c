"""One engine instance: continuous batching with on-demand KV allocation and preemption, as vLLM schedules.

Each step (vllm/v1/core/sched/scheduler.py, Scheduler.schedule):
1. Running requests, in admission order, get their next tokens (a prefill chunk or one decode token)
   within the step's token budget. A request whose new tokens need a block the pool cannot give preempts
   the most recently admitted running request (its blocks are freed, its computed tokens are lost and
   recomputed when it is admitted again, from the front of the queue); if that is itself, it waits.
2. If nobody was preempted, waiting requests are admitted in order while budget and slots last: a prefix
   lookup (and, with a CPU pool, a load of further blocks when copying beats recomputing), then the
   whole sequence must fit in the free blocks now, and only its first chunk is allocated.
3. The step's time comes from StepCost; a request whose known tokens are all computed samples one more.

With `reserve_output` (TensorRT-LLM's default capacity scheduler, GUARANTEED_NO_EVICT; serving/capacity.py) a
request is admitted only while the blocks of every running request's whole sequence, and its own, fit in the
pool, so nobody is ever preempted.

A decode that neither fills nor opens a block nor finishes touches no block (vllm_cache.py): with a vLLM pool
and no speculation, a request is left out of the step loop for the run of such decodes ahead of it ("deferred"),
its counts advanced by the engine's tick when it is next looked at. The loop then visits only the requests that
do something to the pool this step, in admission order, the same order as before.
"""
from __future__ import annotations

import random
from collections import deque
from itertools import islice, takewhile
from operator import attrgetter

import numpy as np

from .cpu_pool import CpuPool
from .metrics import RequestRecord, SimResult
from .step_cost import StepCost
from .workload import SimRequest


class Seq:
    """A request inside an engine: its tokens so far (prompt + sampled) and how many have KV."""
    __slots__ = ("req", "sid", "prompt", "end", "num_tokens", "num_computed", "reused", "hashes", "first_token_s",
                 "admit_s", "gpu_hit", "cpu_hit", "preemptions", "prompt_done", "admitted", "order", "deferred_at",
                 "due_at")

    def __init__(self, req: SimRequest, hashes: list[int]):
        self.req, self.sid, self.hashes = req, req.rid, hashes
        self.prompt, self.end = req.prompt_tokens, req.prompt_tokens + req.output_tokens   # done at num_tokens == end
        self.num_tokens, self.num_computed, self.reused = req.prompt_tokens, 0, 0
        self.first_token_s = self.admit_s = None
        self.gpu_hit = self.cpu_hit = self.preemptions = 0
        self.prompt_done = self.admitted = False
        self.order = 0                 # admissions to its engine before its latest one: its place in the batch
        self.deferred_at = None        # the engine tick its counts are as of, while deferred (Engine._defer)
        self.due_at = -1               # the tick it is next looked at, while deferred


_ORDER = attrgetter("order")
LONG_BATCH = 32     # deferred requests from which a decode run is first checked against the next arrival


class Engine:
    def __init__(self, index: int, cache, cost: StepCost, config, cpu: CpuPool | None, result: SimResult,
                 on_finish=None):
        self.index, self.cache, self.cost, self.config, self.cpu, self.res = index, cache, cost, config, cpu, result
        self.on_finish = on_finish
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.clock = 0.0
        self.marked = 0.0                 # memory is integrated up to here
        self.link_free_s = 0.0            # the GPU->CPU copy engine is busy until then
        self.seen_blocks: set[int] = set()  # prompt blocks computed here before (for "re-needed")
        self.requests = 0
        self.prompt_tokens = self.hit_tokens = 0
        # speculative decoding: each decode verifies k + 1 tokens (a tree's N) and gains a drawn number of them
        self.verify_tokens = cost.speculation.verify_tokens if cost.speculation is not None else 1
        self.rng = random.Random(index)
        self.reserved_blocks = 0          # the running requests' whole sequences, under reserve_output
        self.admissions = 0
        # deferred decodes (module docstring): running requests are either deferred or in `active`, in batch order
        self.defers = cache.decode_granule > 2 and self.verify_tokens == 1
        self.tick = 0                      # regular steps and decode-run steps taken: a deferred request's clock
        self.active: list[Seq] = []
        self.deferred = 0                  # deferred requests, and the sum of their num_computed - deferred_at
        self.deferred_sum = 0
        self.due: dict[int, list[Seq]] = {}    # tick -> deferred requests to look at then

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def enqueue(self, seq: Seq, now: float) -> None:
        if not self.has_work():
            self.clock = max(self.clock, now)
        self.requests += 1
        self.waiting.append(seq)

    # -- one step --------------------------------------------------------------------------------------
    def step(self, horizon: float = float("inf")) -> None:
        """One scheduler step; or, when every running request is decoding and nothing can change the batch
        before `horizon` (the next arrival), a run of such steps at once."""
        cfg, cache, running = self.config, self.cache, self.running
        self._integrate(self.clock)
        if self.defers:
            self._wake(self.tick)
        if running and cache.decode_granule > 1 and len(running) <= cfg.max_prefill_tokens \
                and self.verify_tokens == 1 and self._decode_run(horizon):
            return
        budget, granule, verify, preempted = cfg.max_prefill_tokens, cache.decode_granule, self.verify_tokens, False
        spec = self.cost if verify > 1 else None
        todo = running
        if self.defers:
            todo = self.active
            if self.deferred:
                # each deferred decode takes one token of the budget; when the step's tokens cannot run out before
                # the batch's end, where in the batch they take it changes nothing. Otherwise all are looked at.
                if self.deferred + sum(s.num_tokens - s.num_computed for s in todo) > budget:
                    self._wake_all()
                    todo = self.active
                else:
                    budget -= self.deferred
        # a decode's tokens advance here, as it is scheduled: nothing later in the step reads them (the admission
        # looks at waiting requests and the pool only; a preemption takes a victim not yet scheduled)
        decodes = decode_ctx = 0
        chunks, finished = [], []     # (seq, tokens) prefill chunks; decodes that sample their last token
        i = 0
        while i < len(todo) and budget > 0:
            s = todo[i]
            c, t = s.num_computed, s.num_tokens
            decoding = t - c == 1 and t > s.prompt
            if decoding and verify == 1 and c % granule and (c + 1) % granule:   # a decode inside a block
                decodes += 1
                decode_ctx += c
                s.num_computed, s.num_tokens = c + 1, t + 1
                if t + 1 >= s.end:
                    finished.append(s)
                budget -= 1
                i += 1
                continue
            n = min(verify, s.end - c) if decoding and verify > 1 else t - c   # a speculative decode verifies more
            if n > budget:
                n = budget
            while not cache.allocate(s, n):
                victim = running.pop()
                if todo is not running:     # the victim had not been scheduled: deferred, or later in `todo`
                    if victim.deferred_at is not None:
                        budget += 1
                    else:
                        todo.remove(victim)
                self._preempt(victim)
                preempted = True
                if victim is s:
                    break
            else:
                if decoding:
                    gained = min(spec.accepted(self.rng), s.end - t) if spec is not None else 1
                    if spec is not None:
                        self.res.speculative_steps += 1
                        self.res.speculative_tokens += gained
                    decodes += 1
                    decode_ctx += c
                    s.num_computed, s.num_tokens = c + gained, t + gained
                    if t + gained >= s.end:
                        finished.append(s)
                else:
                    chunks.append((s, n))
                budget -= n
                i += 1
                continue
            break
        if self.deferred:      # the deferred decodes of this step (none finishes: each is looked at before)
            decodes += self.deferred
            decode_ctx += self.deferred_sum + self.deferred * self.tick
        self.tick += 1
        load_s = 0.0
        if not preempted:
            load_s = self._admit(chunks, budget)
        if not (decodes or chunks):
            if not preempted and not self.running and self.waiting:   # cannot fit even alone: never hang
                self.res.rejected_ids.append(self.waiting.popleft().req.rid)
            return
        self._run(decodes, decode_ctx, finished, chunks, load_s)
        if self.defers:
            self._defer()

    # -- deferred decodes ------------------------------------------------------------------------------
    def _defer(self) -> None:
        """Take out of `active` each request whose next decodes neither fill nor open a block nor finish: it is
        looked at again at the tick the first that does is due (a decode at num_computed c fills its block when
        (c + 1) % block_size == 0 and opens one when c % block_size == 0)."""
        g, tick, due, keep = self.cache.decode_granule, self.tick, self.due, []
        for s in self.active:
            c, t = s.num_computed, s.num_tokens
            if t >= s.end:             # finished this step
                continue
            r = c % g
            ahead = min(g - 1 - r, s.end - t - 1) if r and t - c == 1 and t > s.prompt else 0
            if ahead > 0:
                s.deferred_at, s.due_at = tick, tick + ahead
                self.deferred += 1
                self.deferred_sum += c - tick
                later = due.get(tick + ahead)
                if later is None:
                    due[tick + ahead] = [s]
                else:
                    later.append(s)
            else:
                keep.append(s)
        self.active = keep

    def _undefer(self, s: Seq) -> None:
        """Bring a deferred request's counts up to this tick."""
        since = s.deferred_at
        self.deferred -= 1
        self.deferred_sum -= s.num_computed - since
        s.num_computed += self.tick - since
        s.num_tokens += self.tick - since
        s.deferred_at = None

    def _wake(self, tick: int) -> None:
        """The deferred requests due now rejoin `active`, in batch order."""
        due = self.due.pop(tick, None)
        if due:
            active = self.active
            for s in due:
                if s.deferred_at is not None and s.due_at == tick:
                    self._undefer(s)
                    active.append(s)
            active.sort(key=_ORDER)

    def _wake_all(self) -> None:
        if self.deferred:
            for s in self.running:
                if s.deferred_at is not None:
                    self._undefer(s)
            self.due.clear()
        self.active = list(self.running)

    def _decode_run(self, horizon: float) -> bool:
        """Steps in which every running request decodes one token, none finishes before the last, nobody
        waits who could be admitted, and the pool has the blocks they grow into: their order within the run
        cannot change what is cached or evicted, so they are taken together (the step times still differ
        step by step, as the context grows)."""
        running, cost, cache = self.running, self.cost, self.cache
        if self.waiting and not (len(running) >= self.config.max_running or self._unreserved(self.waiting[0])
                                 or (self.cpu is None and cache.cannot_admit(self.waiting[0]))):
            return False
        steps, context = 1 << 30, 0
        for s in (self.active if self.defers else running):     # deferred requests are decoding
            if s.num_tokens - s.num_computed != 1 or s.num_tokens == s.prompt:
                return False
            left = s.end - s.num_tokens
            if left < steps:
                steps = left
            context += s.num_computed
        if steps < 4:                    # the first to finish samples its last token in the run's last step
            return False
        batch = len(running)
        if cost.par.pp > 1 or batch > cost.defaults.graph_max_batch:
            return False     # staged or eagerly launched steps: priced one by one (StepCost.step)
        if self.deferred:
            # in a long batch, an arrival within four steps ends it as it would end the run below (the same step
            # times); only then are the deferred requests looked at for the one that finishes first
            context += self.deferred_sum + self.deferred * self.tick
            if self.deferred >= LONG_BATCH and self._run_end(batch, context, 4, horizon)[0] < 4:
                return False
            self._wake_all()
            steps = min(steps, min(s.end - s.num_tokens for s in running))
            if steps < 4:
                return False
        steps, now = self._run_end(batch, context, steps, horizon)
        if steps < 4 or not cache.grow_all(running, steps):
            return False
        finished = []
        for s in running:
            s.num_computed += steps
            s.num_tokens += steps
            if s.num_tokens >= s.end:
                finished.append(s)
        self._integrate(now)
        self.res.itl.append(((now - self.clock) / steps, batch * steps))
        self.clock = now
        self.res.steps += steps
        self.tick += steps
        if cache.used_blocks > self.res.gpu_used_peak:
            self.res.gpu_used_peak = cache.used_blocks
        if finished:
            self._finish_all(finished, now)
        if self.defers:
            self._defer()
        return True

    def _run_end(self, batch: int, context: int, steps: int, horizon: float) -> tuple[int, float]:
        """(steps taken, end time) of a run of at most `steps` decode steps of `batch` requests over `context`
        tokens in all, ending with the first step that reaches `horizon`."""
        cost = self.cost
        # the same terms as StepCost.step of `batch` decodes: with CUDA graphs and one stage, what the step costs
        # beyond its kernels does not depend on them, unless the engine schedules ahead (its host work hides under
        # each step's kernels, its attention included)
        scale = cost.kernel_scale
        outside_attention = (cost.linear(batch) + cost.logits(batch)) * scale
        overhead = None if cost.async_scheduling else cost.beyond_kernels(batch, batch, outside_attention,
                                                                          decode_only=True)
        # step j ends at the sum of the steps before it, each outside_attention + its attention + overhead (numpy
        # adds in the same order: the same floats)
        now, j = self.clock, 0
        while j < steps:
            attention = cost.decode_attention_from(batch, context // batch + j, steps - j) * scale
            beyond = overhead if overhead is not None else \
                cost.beyond_kernels(batch, batch, outside_attention + attention, decode_only=True)
            ends = np.add.accumulate(np.concatenate(([now], outside_attention + attention + beyond)))[1:]
            crossed = int(np.searchsorted(ends, horizon))
            if crossed < len(ends):
                return j + crossed + 1, float(ends[crossed])
            j, now = j + len(ends), float(ends[-1])
        return j, now

    def _admit(self, chunks: list, budget: int) -> float:
        cfg, cache, res, load_s = self.config, self.cache, self.res, 0.0
        bs = cache.block_size
        while self.waiting and budget > 0 and len(self.running) < cfg.max_running:
            s = self.waiting[0]
            if self._unreserved(s) or (self.cpu is None and cache.cannot_admit(s)):
                break
            handle, hit = cache.lookup(s)
            ext, transfer = 0, 0.0
            if self.cpu is not None and cfg.prefix_caching:
                ext, transfer = self._cpu_hit(s, hit)
            n = min(s.num_tokens - hit - ext, budget)
            if not cache.allocate(s, n, handle, hit, ext, full_must_fit=True):
                break
            self.waiting.popleft()
            self.running.append(s)
            if cfg.reserve_output:
                self.reserved_blocks += cache.required_blocks(s.end)
            s.order = self.admissions
            self.admissions += 1
            if self.defers:
                self.active.append(s)
            s.num_computed = hit + ext
            s.prompt_done = False
            load_s += transfer
            self._count_renneeded(s, hit + ext)
            s.reused = hit + ext
            if not s.admitted:
                s.admitted, s.admit_s, s.gpu_hit, s.cpu_hit = True, self.clock, hit, ext
                self.prompt_tokens += s.num_tokens
                self.hit_tokens += hit + ext
            else:
                res.preempted_queries += s.num_tokens
                res.preempted_hits += hit + ext
            if ext:
                res.cpu_hit_blocks += (hit + ext) // bs - hit // bs
                res.cpu_load_s += transfer
            chunks.append((s, n))
            budget -= n
        return load_s

    def _unreserved(self, s: Seq) -> bool:
        """Under reserve_output: `s`'s whole sequence does not fit beside the running requests' reservations (they
        change only when one leaves, so a decode run may go on while this holds)."""
        return self.config.reserve_output and \
            self.reserved_blocks + self.cache.required_blocks(s.end) > self.cache.capacity_blocks

    def _release(self, s: Seq) -> None:
        if self.config.reserve_output:
            self.reserved_blocks -= self.cache.required_blocks(s.end)

    def _cpu_hit(self, s: Seq, hit: int) -> tuple[int, float]:
        """Further leading blocks in the CPU pool, loaded only when copying beats recomputing them."""
        bs, cfg = self.cache.block_size, self.config
        first = hit // bs
        found = self.cpu.match(s.hashes, first, min((s.num_tokens - 1) // bs, len(s.hashes)))
        if not found:
            return 0, 0.0
        ext = (first + found) * bs - hit
        transfer = found * cfg.block_bytes / cfg.host_link_bytes_per_s
        recompute = (self.cost.linear(ext) + self.cost.prefill_attention(ext, hit)) * self.cost.kernel_scale
        if transfer >= recompute:
            return 0, 0.0
        self.cpu.touch(s.hashes[first:first + found])
        self.res.cpu_saved_compute_s += recompute
        return ext, transfer

    def _count_renneeded(self, s: Seq, reused: int) -> None:
        """Prompt blocks this request computes although they had been computed here before. Block hashes are
        chained, so past the first block never computed here none was: the scan stops there."""
        bs = self.cache.block_size
        stop = min((s.num_tokens - 1) // bs, len(s.hashes))
        self.res.renneeded_blocks += len(list(takewhile(self.seen_blocks.__contains__,
                                                        islice(s.hashes, reused // bs, max(stop, reused // bs)))))

    def _preempt(self, s: Seq) -> None:
        if s.deferred_at is not None:
            self._undefer(s)
        self.cache.free_seq(s, finished=False)
        self._release(s)
        self.res.preemptions += 1
        self.res.recomputed_tokens += s.num_computed
        s.num_computed = 0
        s.preemptions += 1
        self.waiting.appendleft(s)

    def _run(self, decodes: int, decode_ctx: int, finished: list, chunks: list, load_s: float) -> None:
        """The step's forward: `decodes` decode steps (already advanced, over `decode_ctx` tokens in all, of which
        `finished` sampled their last token) and the prefill chunks."""
        cache, res = self.cache, self.res
        sampled = []
        shapes = []
        for s, n in chunks:
            shapes.append((n, s.num_computed))
            res.computed_prefill_tokens += n
            s.num_computed += n
            if s.num_computed < s.num_tokens:
                cache.prefill_chunk_done(s)
            else:
                sampled.append(s)
        step_s = self.cost.step(shapes, decodes, decode_ctx // decodes if decodes else 0) + load_s
        now = self.clock + step_s
        if decodes:
            res.itl.append((step_s, decodes))
        stores = []
        for s in sampled:   # a prefill (or a recompute) is done: its first (next) token is sampled
            if not s.prompt_done:
                s.prompt_done = True
                stores.append(s)
            s.num_tokens += 1
            if s.first_token_s is None:
                s.first_token_s = now
            if s.num_tokens >= s.end:
                finished.append(s)
            else:
                cache.prefill_chunk_done(s)
        if stores:
            now += self._write_through(stores, now)
        self._integrate(now)   # the step holds what it allocated
        self.clock = now
        res.steps += 1
        if cache.used_blocks > res.gpu_used_peak:
            res.gpu_used_peak = cache.used_blocks
        if cache.evictable_blocks > res.gpu_evictable_peak:
            res.gpu_evictable_peak = cache.evictable_blocks
        if finished:
            self._finish_all(finished, now)

    def _write_through(self, seqs: list[Seq], now: float) -> float:
        """Prefill done: full prompt blocks go to the CPU pool. Returns the step time the copy adds."""
        bs, cfg, res = self.cache.block_size, self.config, self.res
        for s in seqs:
            self.seen_blocks.update(s.hashes[s.reused // bs:s.prompt // bs])
        if self.cpu is None:
            return 0.0
        new = sum(self.cpu.store(s.hashes[:s.req.prompt_tokens // bs]) for s in seqs)
        copy_s = new * cfg.block_bytes / cfg.host_link_bytes_per_s
        res.cpu_store_s += copy_s
        if cfg.overlap_store:   # an async copy engine: it only waits for earlier copies
            self.link_free_s = max(self.link_free_s, now) + copy_s
            res.store_backlog_s = max(res.store_backlog_s, self.link_free_s - now)
            return 0.0
        return copy_s

    def _finish_all(self, finished: list, now: float) -> None:
        for s in finished:
            self._finish(s, now)
        if len(finished) <= 4:     # the usual step: a few leave a long batch
            for s in finished:
                self.running.remove(s)
        else:
            done = set(map(id, finished))
            self.running = [s for s in self.running if id(s) not in done]

    def _finish(self, s: Seq, now: float) -> None:
        self.cache.free_seq(s, finished=True)
        self._release(s)
        r = s.req
        tpot = (now - s.first_token_s) / (r.output_tokens - 1) if r.output_tokens > 1 else None
        # the client sees each request later by the engine's per-request work outside the steps
        # (API server, tokenizer, detokenizer: cost/engines.py ServingOverheads.request_ms)
        outside = self.cost.overheads.request_ms * 1e-3
        self.res.records.append(RequestRecord(r.rid, r.arrival_s, s.admit_s, s.first_token_s - r.arrival_s + outside,
                                              tpot, r.prompt_tokens, r.output_tokens, s.gpu_hit, s.cpu_hit,
                                              r.session if r.session is not None else f"request-{r.rid}",
                                              self.index, s.preemptions, now + outside))
        if self.on_finish is not None:
            self.on_finish(r, now)

    def _integrate(self, until: float) -> None:
        dt = until - self.marked
        if dt > 0:
            self.res.gpu_used_block_s += self.cache.used_blocks * dt
            self.res.gpu_evictable_block_s += self.cache.evictable_blocks * dt
            self.marked = until

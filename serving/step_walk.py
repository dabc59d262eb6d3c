"""An engine's steps one by one over a finite set of requests: what the steady-state model walks when a burst or a
finite overloaded run has no steady state (serving/steady_state.py)."""
from __future__ import annotations

import heapq
import math

from .server_intake import ServerIntake


def walk(step, arrivals: list[float], requests: list[tuple[int, int]], admit: int, budget: int, chunked: bool,
         tokens_per_step: float = 1.0, full_step_prefill: float = 0.0,
         users: int = 0, resend_s: float = 0.0, prefill_apart: bool = False,
         intake_s: float = 0.0) -> tuple[list[float], list[float], float]:
    """An engine's steps over requests [(prompt tokens to prefill, output tokens)] arriving at `arrivals`
    (sorted seconds): (each request's wait for its first token, each TPOT, makespan from the first arrival to the
    last token). Each step fills the token budget with the running requests' decodes, then with prefill of the
    admitted prompts in order; at most `admit` requests run (prefilling or decoding) at once. `full_step_prefill`:
    prefill tokens a step carries beyond these while every slot is taken and requests wait (the recompute of the
    requests a full KV cache preempts, serving/preemption.py). `users` > 0: a client that keeps at most that many
    requests in flight (`vllm bench serve --max-concurrency`): `arrivals` are then when each may be sent, and
    request j is sent once j - users requests have finished; it passes the HTTP server, which shares its time
    among the requests it holds (`intake_s` each, serving/server_intake.py), and reaches the engine `resend_s`
    later; its wait counts from then. `prefill_apart`:
    a step with prompts to prefill runs only them, on the whole budget, and the decoding requests wait through it
    (SGLang's scheduler)."""
    n = len(arrivals)
    t = arrivals[0]
    waiting: list = []             # indices not yet admitted, in arrival order (a pointer into it)
    head = 0
    prefilling: list = []          # [arrival, prompt tokens left, output tokens]
    decoding: list = []            # heap of (decode step index of its last token, first-token time, output tokens)
    done, nxt, steps = 0, 0, 0     # steps: the steps that advanced the decoding requests
    waits: list[float] = []
    tpots: list[float] = []
    sent = list(arrivals)          # when each request reaches the engine
    finished_at: list[float] = []  # completion times, in order: the slots a capped client frees
    server = ServerIntake(intake_s) if users else None
    fed = through = 0              # a capped client's requests sent to the server, and out of it (in order)

    def next_send() -> float:
        if fed < n and fed < users + len(finished_at):
            return arrivals[fed] if fed < users else max(arrivals[fed], finished_at[fed - users])
        return math.inf

    def next_exit() -> float:
        d = server.next_departure()
        return math.inf if d is None else d

    def pump(now: float) -> None:
        """The client's sends and the server's hand-offs up to `now`, in time order."""
        nonlocal fed, through
        while min(send := next_send(), out := next_exit()) <= now:
            if out <= send:
                for j in server.depart(out):
                    sent[j] = out + resend_s
                    through += 1
            else:
                server.arrive(send, fed)
                fed += 1

    while done < n:
        if server is not None:
            pump(t)
        while nxt < n and (server is None or nxt < through):
            if sent[nxt] > t:
                break
            waiting.append(nxt)
            nxt += 1
        while head < len(waiting) and len(prefilling) + len(decoding) < admit:
            k = waiting[head]
            head += 1
            prefilling.append([sent[k], requests[k][0], requests[k][1]])
        if not prefilling and not decoding:     # idle until the next request arrives
            t = sent[nxt] if server is None or nxt < through else min(next_send(), next_exit())
            continue
        alone = prefill_apart and bool(prefilling)
        room, prefill, finished = budget - (0 if alone else len(decoding)), 0, 0
        for item in prefilling:
            if room <= 0:
                break
            take = min(item[1], room) if chunked else item[1]
            if not chunked and take > room and prefill:
                break                  # an unchunked prompt waits for a step with room for all of it
            prefill += take
            room -= take
            item[1] -= take
            if item[1]:
                break
            finished += 1
        full = full_step_prefill if head < len(waiting) and len(prefilling) + len(decoding) >= admit else 0.0
        t += step(0 if alone else len(decoding), prefill + full)
        steps += not alone
        while decoding and decoding[0][0] <= steps:
            _, first, output = heapq.heappop(decoding)
            done += 1
            finished_at.append(t)
            tpots.append((t - first) / (output - 1))
        for arrival, _, output in prefilling[:finished]:
            waits.append(t - arrival)
            if output > 1:
                heapq.heappush(decoding, (steps + math.ceil((output - 1) / tokens_per_step), t, output))
            else:
                done += 1
                finished_at.append(t)
        del prefilling[:finished]
    return waits, tpots, t - arrivals[0]

"""One hand-computed case per cache rule (serving/vllm_cache.py, serving/radix_cache.py): hit counts and
eviction order on tiny traces."""
import pytest

from cost.profile import load_profile
from serving.radix_cache import RadixCache
from serving.simulator import ServerConfig, StepCost, simulate
from serving.vllm_cache import VllmBlockCache
from serving.workload import SimRequest
from tracer import TraceOptions, resolve_model


class Seq:
    """What a cache sees of a request: its identity, tokens so far and block hashes."""

    def __init__(self, sid, segments, output=1, block_size=4, answer=None):
        self.req = SimRequest(sid, 0.0, sum(n for _, n in segments), output, segments=segments, output_segment=answer)
        self.req.hash_blocks(block_size)
        self.sid, self.hashes = sid, self.req.block_hashes
        self.num_tokens, self.num_computed = self.req.prompt_tokens, 0


def serve(cache, seq) -> int:
    """Admit, prefill in one chunk, decode to the end one token a step, finish; returns the hit tokens."""
    handle, hit = cache.lookup(seq)
    assert cache.allocate(seq, seq.num_tokens - hit, handle, hit, full_must_fit=True)
    seq.num_computed = seq.num_tokens
    cache.prefill_chunk_done(seq)
    seq.num_tokens += 1
    while seq.num_tokens < seq.req.prompt_tokens + seq.req.output_tokens:
        assert cache.allocate(seq, 1)
        seq.num_computed += 1
        seq.num_tokens += 1
    cache.free_seq(seq, finished=True)
    return hit


# -- vLLM --------------------------------------------------------------------------------------------------
def test_vllm_frees_tail_first_so_a_partly_evicted_prompt_still_hits():
    cache = VllmBlockCache(num_blocks=7, block_size=4)   # block 0 is the null block: 6 usable
    a = Seq(1, [("doc", 16)])
    assert serve(cache, a) == 0
    a0, a1, a2, a3 = a.hashes[:4]
    assert serve(cache, Seq(2, [("other", 15)])) == 0  # takes the 2 never-used blocks, then 2 of a's: its tail
    assert cache.evicted_blocks == 2
    assert a0 in cache.cached and a1 in cache.cached and a2 not in cache.cached and a3 not in cache.cached
    assert serve(cache, Seq(3, [("doc", 16)])) == 8    # the head survived: 2 blocks hit


def test_vllm_caches_output_blocks_but_not_the_one_holding_the_last_token():
    cache = VllmBlockCache(num_blocks=20, block_size=4)
    # prompt 8 + answer 6: KV is computed for 8 + 5 = 13 tokens, so 3 full blocks are cached
    serve(cache, Seq(1, [("chat", 8)], output=6, answer="answer-1"))
    assert cache.evictable_blocks == 3
    # the next turn resends the answer: it hits through the first answer block (8 + 4 tokens)
    assert serve(cache, Seq(2, [("chat", 8), ("answer-1", 6), ("next", 3)])) == 12


def test_vllm_recomputes_the_last_block_of_a_fully_cached_aligned_prompt():
    cache = VllmBlockCache(num_blocks=300, block_size=16)
    serve(cache, Seq(1, [("prompt", 2048)], block_size=16))
    assert serve(cache, Seq(2, [("prompt", 2048)], block_size=16)) == 2032   # num_tokens - 1, in whole blocks


def test_vllm_admission_needs_the_whole_prompt_and_growth_is_one_block_at_a_time():
    cache = VllmBlockCache(num_blocks=6, block_size=4)    # 5 usable
    a, b = Seq(1, [("a", 8)], output=9), Seq(2, [("b", 20)], output=2)
    assert cache.allocate(a, 4, full_must_fit=True)       # its first chunk: 1 block (the 2-block prompt fits)
    assert cache.used_blocks == 1
    assert not cache.allocate(b, 4, full_must_fit=True)   # b's first chunk would fit, its 5-block prompt does not
    assert cache.used_blocks == 1
    a.num_computed = 4
    assert cache.allocate(a, 4) and cache.used_blocks == 2
    a.num_computed, a.num_tokens = 8, 9                  # first token sampled: the decode needs a third block
    assert cache.allocate(a, 1) and cache.used_blocks == 3
    a.num_computed, a.num_tokens = 9, 10
    assert cache.allocate(a, 1) and cache.used_blocks == 3


def test_vllm_preempts_the_newest_request_and_recomputes_it():
    cost = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1)
    reqs = [SimRequest(i, 0.0, 64, 40, segments=[(f"p{i}", 64)]) for i in range(2)]
    # 10 usable blocks: both 4-block prompts are admitted at once (reserving prompt + output would need 14);
    # their decodes then outgrow the pool and the newer one is preempted
    res = simulate(reqs, cost, ServerConfig(block_size=16, gpu_blocks=11, block_bytes=1, api_server=False))
    assert res.completed == 2 and res.preemptions >= 1 and res.recomputed_tokens > 0
    assert [r.admit_s for r in res.records] == [0.0, 0.0]
    assert sorted(r.preemptions for r in res.records) == [0, res.preemptions]


# -- SGLang ------------------------------------------------------------------------------------------------
def test_sglang_hits_to_the_token_where_vllm_floors_to_blocks():
    for cache, expected in ((RadixCache(100, 4), 10), (VllmBlockCache(100, 4), 8)):
        serve(cache, Seq(1, [("shared", 10), ("x", 6)]))
        assert serve(cache, Seq(2, [("shared", 10), ("y", 6)])) == expected, cache.name
    radix = RadixCache(100, 1)
    serve(radix, Seq(1, [("p", 50)], block_size=1))
    assert serve(radix, Seq(2, [("p", 50)], block_size=1)) == 49   # at most input length - 1


def test_sglang_evicts_unlocked_leaves_least_recent_first_and_keeps_the_shared_head():
    cache = RadixCache(num_blocks=40, block_size=1)   # 40 token slots
    serve(cache, Seq(1, [("system", 10), ("a", 10)], block_size=1))
    assert serve(cache, Seq(2, [("system", 10), ("b", 10)], block_size=1)) == 10   # splits system | a
    assert cache.tree_tokens == 30
    cache._evict(1)                                    # one whole leaf: a, the least recently used
    assert cache.evicted_tokens == 10
    assert cache.peek(Seq(5, [("system", 10), ("b", 10)], block_size=1)) == 19     # b survived
    assert cache.peek(Seq(6, [("system", 10), ("a", 10)], block_size=1)) == 10     # a went, the head stayed
    serve(cache, Seq(3, [("c", 30)], block_size=1))    # 30 slots with 20 free: b goes too, the head stays
    assert cache.evicted_tokens == 20
    assert serve(cache, Seq(4, [("system", 10), ("d", 10)], block_size=1)) == 10


def test_sglang_caches_the_output_as_its_own_leaf():
    cache = RadixCache(num_blocks=100, block_size=1)
    serve(cache, Seq(1, [("chat", 8)], output=5, block_size=1, answer="answer-1"))
    assert cache.tree_tokens == 12                      # prompt 8 + the 4 answer tokens whose KV was computed
    assert serve(cache, Seq(2, [("chat", 8), ("answer-1", 5), ("next", 3)], block_size=1)) == 12
    cache2 = RadixCache(num_blocks=100, block_size=1)
    serve(cache2, Seq(1, [("chat", 8)], output=5, block_size=1, answer="answer-1"))
    cache2._evict(1)                                    # the output leaf goes first, the prompt stays
    assert cache2.tree_tokens == 8


@pytest.mark.parametrize("seed", range(40))
def test_vllm_free_queue_orders_blocks_as_vllms_linked_list(seed):
    """FreeQueue (a list read from a head, stale entries for blocks taken from the middle) against an OrderedDict
    doing what vLLM's doubly linked list does, under random pops, hits, appends and prepends; as in the cache, a
    block a hit took from the middle comes back only at the back until it is popped again."""
    import random
    from collections import OrderedDict

    from serving.vllm_cache import FreeQueue
    rng = random.Random(seed)
    n = rng.randrange(2, 60)
    queue, model, held, hit = FreeQueue(range(1, n)), OrderedDict.fromkeys(range(1, n)), [], set()
    queue.SLACK = rng.choice([1, 2, 4, 1024])
    for _ in range(300):
        op = rng.randrange(4)
        if op == 0 and model:
            k = rng.randrange(1, len(model) + 1)
            popped = queue.popleft(k)
            assert popped == [model.popitem(last=False)[0] for _ in range(k)]
            held += popped
            hit -= set(popped)
        elif op == 1 and model:
            b = rng.choice(list(model))
            del model[b]
            queue.remove(b)
            held.append(b)
            hit.add(b)
        elif op >= 2 and held:
            rng.shuffle(held)
            k = rng.randrange(1, len(held) + 1)
            out, held = held[:k], held[k:]
            back = out if op == 2 else [b for b in out if b in hit]
            front = [b for b in out if b not in back]
            queue.append(back)
            model.update(dict.fromkeys(back))
            queue.prepend(front)
            for b in reversed(front):
                model[b] = None
                model.move_to_end(b, last=False)
        assert len(queue) == len(model)
    assert queue.popleft(len(model)) == list(model)

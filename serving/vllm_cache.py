"""vLLM's prefix cache: a pool of physical KV blocks with a free queue that is also the eviction order.

The rules, as vLLM v1 implements them (vllm/v1/core/block_pool.py, kv_cache_manager.py,
single_type_kv_cache_manager.py, kv_cache_utils.py):
- Block 0 is the null block and is never handed out, so N blocks hold N - 1 blocks of KV.
- A free block (no running request refers to it) stays in the free queue with its hash, still hittable.
  New blocks are popped from the queue's front; popping a block that has a hash evicts it (one eviction).
- A finished or preempted request frees its blocks tail first: blocks without a hash go to the front of
  the queue, hashed ones to the back in that reversed order, so a prompt's tail is evicted before its head.
- A block is cached (gets its hash) once full, at the step that schedules its last token, prompt or
  output alike; the block holding the last sampled token is never computed, so never cached.
- A lookup matches whole blocks from the start, at most (num_tokens - 1) tokens floored to whole blocks:
  a fully cached block-aligned prompt recomputes its last block.
- Identical blocks are not de-duplicated: two requests that computed the same block each keep a copy;
  a lookup takes the earliest cached one.
"""
from __future__ import annotations

from functools import partial
from itertools import islice, takewhile
from operator import is_not

_FOUND = partial(is_not, None)    # a dict.get that found something (C-level, for takewhile)


class FreeQueue:
    """vLLM's free block queue (block_pool.py FreeKVCacheBlockQueue, a doubly linked list) as a list read from a
    head index, so that popping, appending and prepending many blocks are slices at C speed. A block taken out of
    the middle (an evictable block a lookup hit) leaves a stale entry behind, skipped when it reaches the head: it
    is always ahead of that block's next entry, as a block comes back to the queue only at the back (it has a hash:
    hit blocks do) until it has been popped again."""
    SLACK = 1024     # consumed entries kept before the head, so a prepend rarely moves the list

    def __init__(self, blocks: range):
        self.items, self.head, self.size = list(blocks), 0, len(blocks)
        self.stale: dict[int, int] = {}      # block -> stale entries of it still in the list
        self.num_stale = 0

    def __len__(self) -> int:
        return self.size

    def popleft(self, n: int) -> list[int]:
        items, h = self.items, self.head
        out = items[h:h + n]
        if not self.num_stale or self.stale.keys().isdisjoint(out):    # no stale entry among the next n
            h += n
        else:
            out, stale = [], self.stale
            while len(out) < n:
                b = items[h]
                h += 1
                left = stale.get(b)
                if left:
                    self.num_stale -= 1
                    if left == 1:
                        del stale[b]
                    else:
                        stale[b] = left - 1
                else:
                    out.append(b)
        self.size -= n
        if h > 2 * self.SLACK and 2 * h > len(items):
            del items[:h - self.SLACK]
            h = self.SLACK
        self.head = h
        return out

    def remove(self, b: int) -> None:
        self.stale[b] = self.stale.get(b, 0) + 1
        self.num_stale += 1
        self.size -= 1

    def remove_all(self, blocks: list[int]) -> None:
        """Take distinct blocks out of the queue (their entries go stale)."""
        stale = self.stale
        if stale.keys().isdisjoint(blocks):
            stale.update(dict.fromkeys(blocks, 1))
        else:
            for b in blocks:
                stale[b] = stale.get(b, 0) + 1
        self.num_stale += len(blocks)
        self.size -= len(blocks)

    def append(self, blocks: list[int]) -> None:
        self.items.extend(blocks)
        self.size += len(blocks)

    def prepend(self, blocks: list[int]) -> None:
        """blocks[0] becomes the head."""
        k, h = len(blocks), self.head
        if k <= h:
            self.items[h - k:h] = blocks
            self.head = h - k
        else:
            self.items[:h] = blocks
            self.head = 0
        self.size += k


class VllmBlockCache:
    name = "vllm"

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"a vLLM block pool needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.block_size = block_size
        self.decode_granule = block_size      # decode steps inside a block allocate and cache nothing
        self.prefix_caching = prefix_caching
        self.capacity_blocks = num_blocks - 1
        # per block: running requests holding it, and its hash (0: none; block hashes are never 0). Plain lists:
        # most calls touch one block (a decode step's), where numpy's per-call cost is what would dominate
        self.ref = [0] * num_blocks
        self.hash = [0] * num_blocks
        self.cached: dict[int, int] = {}              # hash -> earliest cached block with it
        self.copies: dict[int, list[int]] = {}        # hash -> later blocks with the same hash
        self.free = FreeQueue(range(1, num_blocks))
        self.free_cached = 0                          # free blocks that still have a hash (evictable)
        self.blocks: dict[int, list[int]] = {}        # sequence id -> its blocks in token order
        self.num_cached: dict[int, int] = {}          # sequence id -> its leading blocks already cached
        self.evicted_blocks = 0
        self.allocated_blocks = 0
        self.releases = 0                             # free_seq calls: the only thing that frees blocks
        self._refused = None                          # (sequence id, releases, hit blocks) of the last refusal

    # -- queries ---------------------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks held by running requests."""
        return self.capacity_blocks - self.free.size

    @property
    def evictable_blocks(self) -> int:
        """Free blocks that still hold cached KV."""
        return self.free_cached

    def required_blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def peek(self, seq) -> int:
        """Tokens a lookup would hit now, without side effects (for routing)."""
        return len(self.lookup(seq)[0]) * self.block_size

    def cannot_admit(self, seq) -> bool:
        """True when `seq` was refused admission and nothing since can have made it fit: no blocks were
        released and its hit chain did not grow. Any other change leaves free blocks minus needed blocks as
        it was or lower (a block a lookup would hit leaves the free queue only by being touched, which
        lowers both, or by being reallocated, which lowers the free count)."""
        refused = self._refused
        if refused is None or refused[0] != seq.sid or refused[1] != self.releases:
            return False
        hits, hashes = refused[2], seq.hashes
        return hits >= min((seq.num_tokens - 1) // self.block_size, len(hashes)) or hashes[hits] not in self.cached

    def lookup(self, seq) -> tuple[list[int], int]:
        """(hit blocks, hit tokens): whole leading blocks, at most num_tokens - 1 tokens."""
        if not self.prefix_caching:
            return [], 0
        limit = min((seq.num_tokens - 1) // self.block_size, len(seq.hashes))
        out = list(takewhile(_FOUND, map(self.cached.get, islice(seq.hashes, limit))))
        return out, len(out) * self.block_size

    # -- changes ---------------------------------------------------------------------------------------
    def allocate(self, seq, num_new: int, hit=None, hit_tokens: int = 0, external: int = 0,
                 full_must_fit: bool = False) -> bool:
        """Give `seq` slots for `num_new` more tokens after its computed ones (plus, at admission, the hit
        blocks and `external` tokens loaded from another tier); False, changing nothing, if they do not fit.
        With full_must_fit the whole sequence must fit in the free blocks now (vLLM's admission check)."""
        bs, ref, free = self.block_size, self.ref, self.free
        held = self.blocks.get(seq.sid)
        if held is not None and not full_must_fit:    # a running request grows
            computed = seq.num_computed
            more = -(-(computed + num_new) // bs) - len(held)
            if more > free.size:
                return False
            if more > 0:
                self._grow(held, more)
            if self.prefix_caching and (computed + num_new) // bs > self.num_cached[seq.sid]:
                self._cache_full_blocks(seq, held, min(computed + num_new, seq.num_tokens))
            return True
        hit = hit or ()
        n_held = len(held) if held is not None else 0
        touched_free = [b for b in hit if not ref[b]]        # evictable hits leave the free queue
        computed = seq.num_computed + hit_tokens + external
        want = -(-(computed + num_new) // bs)
        if ((full_must_fit and max(-(-seq.num_tokens // bs) - n_held - len(hit), 0) + len(touched_free) > free.size)
                or max(want - n_held - len(hit), 0) + len(touched_free) > free.size):
            if full_must_fit and not external:
                self._refused = (seq.sid, self.releases, len(hit))
            return False
        if held is None:
            held = self.blocks[seq.sid] = list(hit)
            if touched_free:
                free.remove_all(touched_free)    # hit blocks all have a hash
                self.free_cached -= len(touched_free)
            for b in hit:
                ref[b] += 1
            self.num_cached[seq.sid] = len(held)
        if want > len(held):
            self._grow(held, want - len(held))
        if self.prefix_caching:
            self._cache_full_blocks(seq, held, min(computed + num_new, seq.num_tokens))
        return True

    def grow_all(self, seqs, steps: int) -> bool:
        """`steps` decode steps of every sequence in `seqs` at once, if the free blocks cover them all."""
        bs, blocks = self.block_size, self.blocks
        need = 0
        for s in seqs:
            need += max(0, -(-(s.num_computed + steps) // bs) - len(blocks[s.sid]))
        if need > self.free.size:
            return False
        for s in seqs:
            # as after the run's last step: num_tokens one past the computed tokens
            s.num_tokens += steps - 1
            self.allocate(s, steps)
            s.num_tokens -= steps - 1
        return True

    def prefill_chunk_done(self, seq) -> None:
        """vLLM caches at scheduling time (allocate); nothing to do after the forward."""

    def free_seq(self, seq, finished: bool) -> None:
        """Release a finished or preempted request's blocks, tail first."""
        held = self.blocks.pop(seq.sid, None)
        cached = self.num_cached.pop(seq.sid, 0)
        if not held:
            return
        self.releases += 1
        ref = self.ref
        # the blocks after its cached ones have no hash and no other holder (only a lookup's hit shares a block)
        first, head = held[cached:][::-1], held[:cached][::-1]
        for b in first:
            ref[b] = 0
        for b in head:
            ref[b] -= 1
        last = [b for b in head if not ref[b]]
        if first:
            self.free.prepend(first)
        self.free.append(last)
        self.free_cached += len(last)

    # -- internals -------------------------------------------------------------------------------------
    def _grow(self, held: list[int], n: int) -> None:
        new = self.free.popleft(n)
        ref, hashes, cached, copies, evicted = self.ref, self.hash, self.cached, self.copies, 0
        for b in new:
            h = hashes[b]
            if h:                          # a free block that still held cached KV: evicted now
                if h not in copies and cached[h] == b:
                    del cached[h]
                else:
                    self._forget(b, h)
                hashes[b] = 0
                evicted += 1
            ref[b] = 1
        held.extend(new)
        if evicted:
            self.evicted_blocks += evicted
            self.free_cached -= evicted
        self.allocated_blocks += n

    def _cache_full_blocks(self, seq, held: list[int], tokens: int) -> None:
        done = self.num_cached[seq.sid]
        upto = min(tokens // self.block_size, len(seq.hashes))
        if upto <= done:
            return
        if upto == done + 1:                    # a decode filled its block
            h, b = seq.hashes[done], held[done]
            self.hash[b] = h
            if h in self.cached:
                self.copies.setdefault(h, []).append(b)
            else:
                self.cached[h] = b
            self.num_cached[seq.sid] = upto
            return
        hashes, cached = seq.hashes[done:upto], self.cached
        blocks = held[done:upto]
        block_hash = self.hash
        for b, h in zip(blocks, hashes):
            block_hash[b] = h
        if cached.keys().isdisjoint(hashes):    # the usual case: no other copy of these blocks
            cached.update(zip(hashes, blocks))
        else:
            for b, h in zip(blocks, hashes):
                if h in cached:
                    self.copies.setdefault(h, []).append(b)
                else:
                    cached[h] = b
        self.num_cached[seq.sid] = upto

    def _forget(self, b: int, h: int) -> None:
        """Block b no longer holds hash h; another copy, if any, takes its place."""
        if self.cached.get(h) == b:
            later = self.copies.get(h)
            if later:
                self.cached[h] = later.pop(0)
                if not later:
                    del self.copies[h]
            else:
                del self.cached[h]
        else:
            later = self.copies[h]
            later.remove(b)
            if not later:
                del self.copies[h]

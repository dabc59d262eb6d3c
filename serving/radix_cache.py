"""SGLang's prefix cache: a radix tree over tokens whose unreferenced leaves are evicted least recently used.

The rules, as SGLang implements them (python/sglang/srt/mem_cache/radix_cache.py, mem_cache/common.py,
mem_cache/evict_policy.py, managers/schedule_batch.py, managers/scheduler_components/batch_result_processor.py):
- Matching is token-granular (page size 1): a hit ends wherever two prompts first differ, with no block
  floor, and at most input length - 1 tokens. A match splits the node it ends inside.
- Every prefill chunk is inserted into the tree when its forward is done (checkpoint); a finished request
  inserts its prompt and its output (all tokens whose KV was computed: prompt + output - 1), split at the
  prompt boundary so the output can go first. A retracted (preempted) request inserts nothing more.
- Running requests lock the path to their last node. Eviction takes unlocked leaves, least recently
  accessed first (match and insert refresh the access time of every node on the path), a whole node at
  a time; a parent left without children becomes a leaf candidate.
- KV slots are tokens: a capacity of C tokens holds the tree plus the running requests' own tokens.

Tokens are identified by (segment id, position in the segment), so a piece (segment, start, end) stands
for a run of tokens and the tree's edges are lists of pieces.
"""
from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("children", "parent", "key", "length", "lock", "atime", "nid", "alive")

    def __init__(self, parent, key: list, length: int, nid: int, atime: int = 0):
        self.children: dict = {}
        self.parent, self.key, self.length, self.nid, self.atime = parent, key, length, nid, atime
        self.lock = 0
        self.alive = True


def _first(key: list) -> tuple:
    seg, start, _ = key[0]
    return seg, start


def _split_pieces(key: list, n: int) -> tuple[list, list]:
    head, left = [], n
    for i, (seg, a, b) in enumerate(key):
        if left >= b - a:
            head.append((seg, a, b))
            left -= b - a
            if left == 0:
                return head, key[i + 1:]
        else:
            return head + [(seg, a, a + left)], [(seg, a + left, b)] + key[i + 1:]
    return head, []


def _common(key: list, query: list, qi: int, qoff: int, limit: int) -> tuple[int, int, int]:
    """Tokens `key` shares with `query` from cursor (qi, qoff), at most `limit`; and the cursor after them."""
    n, ki, koff = 0, 0, 0
    while n < limit and ki < len(key) and qi < len(query):
        ks, ka, kb = key[ki]
        qs, qa, qb = query[qi]
        if ks != qs or ka + koff != qa + qoff:
            break
        take = min(kb - ka - koff, qb - qa - qoff, limit - n)
        n += take
        koff += take
        qoff += take
        if ka + koff == kb:
            ki, koff = ki + 1, 0
        if qa + qoff == qb:
            qi, qoff = qi + 1, 0
    return n, qi, qoff


class RadixCache:
    name = "sglang"

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.block_size = block_size
        self.decode_granule = 1               # every decode token takes a slot
        self.prefix_caching = prefix_caching
        self.capacity_tokens = num_blocks * block_size
        self.capacity_blocks = num_blocks
        self._ids = itertools.count(1)
        self.root = _Node(None, [], 0, 0)
        self.root.lock = 1
        self.tick = 0
        self.tree_tokens = 0
        self.evictable_tokens = 0
        self.private_tokens = 0
        self.heap: list = []                  # (access time, node id, node), checked when popped
        self.seqs: dict[int, list] = {}       # sequence id -> [locked node, tokens owned by the tree, own tokens]
        self.evicted_tokens = 0
        self.allocated_tokens = 0

    # -- queries ---------------------------------------------------------------------------------------
    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.tree_tokens - self.private_tokens

    @property
    def used_blocks(self) -> float:
        return (self.tree_tokens - self.evictable_tokens + self.private_tokens) / self.block_size

    @property
    def evictable_blocks(self) -> float:
        return self.evictable_tokens / self.block_size

    @property
    def evicted_blocks(self) -> float:
        return self.evicted_tokens / self.block_size

    @property
    def allocated_blocks(self) -> float:
        return self.allocated_tokens / self.block_size

    def required_blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def cannot_admit(self, seq) -> bool:
        return False

    def grow_all(self, seqs, steps: int) -> bool:
        return False   # every decode token is an allocation that may evict: taken one step at a time

    def peek(self, seq) -> int:
        if not self.prefix_caching:
            return 0
        return self._walk(seq.req.pieces(seq.num_tokens), seq.num_tokens - 1, touch=False)[1]

    def lookup(self, seq) -> tuple[_Node, int]:
        if not self.prefix_caching:
            return self.root, 0
        node, hit = self._walk(seq.req.pieces(seq.num_tokens), seq.num_tokens - 1, touch=True)
        return node, hit

    # -- changes ---------------------------------------------------------------------------------------
    def allocate(self, seq, num_new: int, hit=None, hit_tokens: int = 0, external: int = 0,
                 full_must_fit: bool = False) -> bool:
        state = self.seqs.get(seq.sid)
        need = num_new + external
        if state is None:
            node = hit or self.root
            protect = 0                       # evictable tokens on the hit path, which locking protects
            n = node
            while n is not self.root:
                if n.lock == 0:
                    protect += n.length
                n = n.parent
            room = self.free_tokens + self.evictable_tokens - protect
            if (full_must_fit and seq.num_tokens - hit_tokens > room) or need > room:
                return False
            self._lock(node)
            state = self.seqs[seq.sid] = [node, hit_tokens, 0]
        elif need > self.free_tokens + self.evictable_tokens:
            return False
        if need > self.free_tokens:
            self._evict(need - self.free_tokens)
        state[2] += need
        self.private_tokens += need
        self.allocated_tokens += need
        return True

    def prefill_chunk_done(self, seq) -> None:
        """Checkpoint: the computed tokens join the tree."""
        if self.prefix_caching:
            self._insert_seq(seq, seq.num_computed, keep_lock=True)

    def free_seq(self, seq, finished: bool) -> None:
        state = self.seqs.get(seq.sid)
        if state is None:
            return
        if finished and self.prefix_caching:
            self._insert_seq(seq, seq.num_computed, keep_lock=False, split_at=seq.req.prompt_tokens)
            state = self.seqs.pop(seq.sid)
        else:
            self.seqs.pop(seq.sid)
            self._unlock(state[0])
        self.private_tokens -= state[2]

    # -- internals -------------------------------------------------------------------------------------
    def _insert_seq(self, seq, tokens: int, keep_lock: bool, split_at: int = 0) -> None:
        state = self.seqs[seq.sid]
        node, protected, own = state
        pieces = seq.req.pieces(tokens)
        prefix, last = self._insert(pieces, tokens)
        if 0 < split_at < tokens:
            self._insert(seq.req.pieces(split_at), split_at)
        moved = (tokens - max(prefix, protected)) + max(0, prefix - protected)   # to the tree, or duplicates freed
        state[2] = own - moved
        self.private_tokens -= moved
        if keep_lock:
            self._lock(last)
            self._unlock(node)
            state[0], state[1] = last, tokens
        else:
            self._unlock(node)

    def _touch(self, node: _Node) -> None:
        node.atime = self.tick
        if node.lock == 0 and not node.children:
            heapq.heappush(self.heap, (node.atime, node.nid, node))

    def _walk(self, query: list, limit: int, touch: bool) -> tuple[_Node, int]:
        self.tick += 1
        node, done, qi, qoff = self.root, 0, 0, 0
        while done < limit and qi < len(query):
            seg, a, _ = query[qi]
            child = node.children.get((seg, a + qoff))
            if child is None:
                break
            n, qi, qoff = _common(child.key, query, qi, qoff, limit - done)
            done += n
            if touch:
                self._touch(child)
            if n < child.length:
                if touch and n:
                    node = self._split(child, n)
                break
            node = child
        return node, done

    def _split(self, child: _Node, n: int) -> _Node:
        head, tail = _split_pieces(child.key, n)
        mid = _Node(child.parent, head, n, next(self._ids), child.atime)
        mid.lock = child.lock
        child.parent.children[_first(head)] = mid
        child.key, child.length, child.parent = tail, child.length - n, mid
        mid.children[_first(tail)] = child
        return mid

    def _insert(self, query: list, total: int) -> tuple[int, _Node]:
        """Insert the first `total` tokens of `query`; (tokens already in the tree, last node)."""
        self.tick += 1
        node, done, qi, qoff = self.root, 0, 0, 0
        while done < total:
            seg, a, _ = query[qi]
            child = node.children.get((seg, a + qoff))
            if child is None:
                rest = [(seg, a + qoff, query[qi][2])] + query[qi + 1:]
                new = _Node(node, rest, total - done, next(self._ids), self.tick)
                node.children[(seg, a + qoff)] = new
                self.tree_tokens += new.length
                self.evictable_tokens += new.length
                heapq.heappush(self.heap, (new.atime, new.nid, new))
                return done, new
            n, qi, qoff = _common(child.key, query, qi, qoff, total - done)
            done += n
            self._touch(child)
            node = self._split(child, n) if n < child.length else child
        return done, node

    def _lock(self, node: _Node) -> None:
        while node is not self.root:
            if node.lock == 0:
                self.evictable_tokens -= node.length
            node.lock += 1
            node = node.parent

    def _unlock(self, node: _Node) -> None:
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self.evictable_tokens += node.length
                if not node.children:
                    heapq.heappush(self.heap, (node.atime, node.nid, node))
            node = node.parent

    def _evict(self, tokens: int) -> None:
        freed, heap = 0, self.heap
        while freed < tokens and heap:
            atime, _, x = heapq.heappop(heap)
            if not x.alive or x.lock or x.children or x.atime != atime:
                continue  # stale entry: locked, grown, touched since, or gone
            parent = x.parent
            del parent.children[_first(x.key)]
            x.alive = False
            self.tree_tokens -= x.length
            self.evictable_tokens -= x.length
            self.evicted_tokens += x.length
            freed += x.length
            if parent is not self.root and parent.lock == 0 and not parent.children:
                heapq.heappush(heap, (parent.atime, parent.nid, parent))

package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
)

// bpeModel merges the bytes of one pre-tokenized piece into token ids.
type bpeModel struct {
	byteID       [256]int32             // id of the single-byte token of each byte
	merges       map[uint64]mergeResult // pairKey(left, right) → what the pair merges into
	vocabID      map[string]int         // raw bytes → id, for ignoreMerges
	ignoreMerges bool                   // a piece that is a whole token is not merged (Llama 3 style)
	cache        *wordCache
}

type mergeResult struct {
	rank int32 // index in model.merges; lower merges first
	id   int32 // the merged token
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// appendWord appends the ids of one piece to dst.
func (m *bpeModel) appendWord(dst []int, word string) []int {
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...)
	}
	if m.ignoreMerges {
		if id, ok := m.vocabID[word]; ok {
			return append(dst, id)
		}
	}
	n := len(dst)
	dst = m.merge(dst, word)
	m.cache.put(word, dst[n:])
	return dst
}

// symbol is one token of a word while it is being merged; the live symbols
// form a linked list in text order.
type symbol struct {
	id         int32
	prev, next int32 // -1 at either end
	gone       bool  // merged into its left neighbour
}

// candidate is a pair that may merge: the symbol at pos with its successor.
type candidate struct {
	rank, pos, id int32
}

func (a candidate) less(b candidate) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

type mergeScratch struct {
	syms []symbol
	heap []candidate
}

var scratchPool = sync.Pool{New: func() any { return new(mergeScratch) }}

// merge is Hugging Face's Word::merge_all (tokenizers/src/models/bpe/word.rs)
// without dropout: repeatedly merge the pair of lowest rank, leftmost first,
// using a heap of candidate pairs that are re-checked when popped.
func (m *bpeModel) merge(dst []int, word string) []int {
	sc := scratchPool.Get().(*mergeScratch)
	defer scratchPool.Put(sc)
	syms := sc.syms[:0]
	for i := 0; i < len(word); i++ {
		syms = append(syms, symbol{id: m.byteID[word[i]], prev: int32(i - 1), next: int32(i + 1)})
	}
	if len(syms) == 0 {
		return dst
	}
	syms[len(syms)-1].next = -1

	h := sc.heap[:0]
	push := func(c candidate) {
		h = append(h, c)
		for i := len(h) - 1; i > 0; {
			p := (i - 1) / 2
			if !h[i].less(h[p]) {
				break
			}
			h[i], h[p] = h[p], h[i]
			i = p
		}
	}
	pop := func() candidate {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		for i := 0; ; {
			l, r, s := 2*i+1, 2*i+2, i
			if l < len(h) && h[l].less(h[s]) {
				s = l
			}
			if r < len(h) && h[r].less(h[s]) {
				s = r
			}
			if s == i {
				break
			}
			h[i], h[s] = h[s], h[i]
			i = s
		}
		return top
	}
	pairAt := func(pos int32) {
		next := syms[pos].next
		if next < 0 {
			return
		}
		if r, ok := m.merges[pairKey(syms[pos].id, syms[next].id)]; ok {
			push(candidate{rank: r.rank, pos: pos, id: r.id})
		}
	}

	for i := range syms {
		pairAt(int32(i))
	}
	for len(h) > 0 {
		c := pop()
		s := &syms[c.pos]
		if s.gone || s.next < 0 {
			continue
		}
		next := s.next
		// The pair may have changed since c was pushed.
		if r, ok := m.merges[pairKey(s.id, syms[next].id)]; !ok || r.id != c.id {
			continue
		}
		s.id = c.id
		syms[next].gone = true
		s.next = syms[next].next
		if s.next >= 0 {
			syms[s.next].prev = c.pos
		}
		if s.prev >= 0 {
			pairAt(s.prev)
		}
		pairAt(c.pos)
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, int(syms[i].id))
	}
	sc.syms, sc.heap = syms, h
	return dst
}

// wordCache remembers the ids of recent pieces. It is sharded to keep lock
// contention low and bounded: a full shard forgets an arbitrary entry.
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

const (
	cacheShards   = 32
	cacheShardMax = 4096 // entries per shard: 131,072 pieces in all
	cacheMaxWord  = 64   // longer pieces are rare and not cached
)

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int)
	}
	return c
}

func (c *wordCache) shard(word string) *cacheShard {
	return &c.shards[maphash.String(c.seed, word)%cacheShards]
}

// get and put do nothing on a nil cache.
func (c *wordCache) get(word string) ([]int, bool) {
	if c == nil || len(word) > cacheMaxWord {
		return nil, false
	}
	s := c.shard(word)
	s.mu.RLock()
	ids, ok := s.m[word]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int) {
	if c == nil || len(word) > cacheMaxWord {
		return
	}
	// Copy both: word points into the caller's text, ids into its result.
	word = strings.Clone(word)
	ids = append([]int(nil), ids...)
	s := c.shard(word)
	s.mu.Lock()
	if len(s.m) >= cacheShardMax {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	s.m[word] = ids
	s.mu.Unlock()
}

package llmpool

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// UnknownModel is the Usage key under which calls naming no model of the
// pool are counted (so that a policy's invented names cannot grow the map).
const UnknownModel = "(unknown)"

// Usage is the accounting of one model's calls.
type Usage struct {
	// Calls is the number of Pool.Call calls, cache hits and failures included.
	Calls int64
	// InputTokens and OutputTokens are the tokens of replies that came from
	// the provider (billed); cache hits add nothing.
	InputTokens  int64
	OutputTokens int64
	// Cost is the money spent, USD: billed tokens times the model's prices
	// per million tokens. Cache hits and failures add 0.
	Cost float64
	// ListCost is the list-price cost, USD, of every successful reply, cached
	// or not: the sum of Response.Cost. Cost/ListCost shows what the cache saves.
	ListCost float64
	// Latency is the summed wall time of the calls.
	Latency time.Duration
	// Failures is the number of calls that returned Failed.
	Failures int64
	// CacheHits is the number of calls answered from the cache.
	CacheHits int64
	// Retries is the number of extra provider requests sent after a failed
	// attempt.
	Retries int64
}

// Add returns u + v, field by field.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		Calls: u.Calls + v.Calls, InputTokens: u.InputTokens + v.InputTokens, OutputTokens: u.OutputTokens + v.OutputTokens,
		Cost: u.Cost + v.Cost, ListCost: u.ListCost + v.ListCost, Latency: u.Latency + v.Latency,
		Failures: u.Failures + v.Failures, CacheHits: u.CacheHits + v.CacheHits, Retries: u.Retries + v.Retries,
	}
}

// Sub returns u - v, field by field.
func (u Usage) Sub(v Usage) Usage {
	return Usage{
		Calls: u.Calls - v.Calls, InputTokens: u.InputTokens - v.InputTokens, OutputTokens: u.OutputTokens - v.OutputTokens,
		Cost: u.Cost - v.Cost, ListCost: u.ListCost - v.ListCost, Latency: u.Latency - v.Latency,
		Failures: u.Failures - v.Failures, CacheHits: u.CacheHits - v.CacheHits, Retries: u.Retries - v.Retries,
	}
}

// UsageMap is a snapshot of Usage per model name (and UnknownModel).
// Per training step: before := pool.Usage(); ...; step := pool.Usage().Sub(before).
type UsageMap map[string]Usage

// Sub returns the usage accrued since the snapshot before: m[k] - before[k]
// for every key of m.
func (m UsageMap) Sub(before UsageMap) UsageMap {
	out := make(UsageMap, len(m))
	for k, u := range m {
		out[k] = u.Sub(before[k])
	}
	return out
}

// Total returns the sum over all models, added in the order of their
// names: the same usage gives the same float sums, bit for bit.
func (m UsageMap) Total() Usage {
	var t Usage
	for _, k := range slices.Sorted(maps.Keys(m)) {
		t = t.Add(m[k])
	}
	return t
}

// usageBook accumulates Usage per model; safe for concurrent use.
type usageBook struct {
	mu sync.Mutex
	m  map[string]*Usage
}

func newUsageBook(names []string) *usageBook {
	b := &usageBook{m: make(map[string]*Usage, len(names))}
	for _, n := range names {
		b.m[n] = &Usage{}
	}
	return b
}

func (b *usageBook) add(name string, u Usage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, ok := b.m[name]
	if !ok {
		cur = &Usage{}
		b.m[name] = cur
	}
	*cur = cur.Add(u)
}

func (b *usageBook) snapshot() UsageMap {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(UsageMap, len(b.m))
	for k, u := range b.m {
		out[k] = *u
	}
	return out
}

package llmpool

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/recal-project/recal/internal/diskcache"
)

// cacheVersion is bumped when the key or the entry format changes; older
// entries then simply miss.
const cacheVersion = 1

// diskCache is the response cache in front of every provider: a
// diskcache.Cache (one JSON file per reply, written atomically, verified on
// read) whose KEY is the SHA-256 (hex) of the provider name and the
// provider's cache key (cacheKey: for openai the endpoint, model id,
// request parameters and messages; for sim the model's settings, the
// question and the sub-query). The API key is never part of it.
//
// Stored texts are valid UTF-8 (Pool.Call normalises replies with validText
// before storing them), so a hit returns the very bytes the fresh call did.
type diskCache struct {
	c *diskcache.Cache
}

// errCacheReadOnly: put was called on a read-only cache (a bug in the
// caller; Pool.Call never does).
var errCacheReadOnly = diskcache.ErrReadOnly

// cacheEntry is what the cache stores of a reply.
type cacheEntry struct {
	Text         string `json:"text"`
	InputTokens  int    `json:"input_tokens"`
	OutputTokens int    `json:"output_tokens"`
	Estimated    bool   `json:"estimated,omitempty"`
}

// cacheEnvelope is the file format. Checksum is the SHA-256 (hex) of the
// JSON encoding of Entry.
type cacheEnvelope struct {
	diskcache.Header
	Model    string     `json:"model"`    // pool model name, for people reading the files
	Provider string     `json:"provider"` // provider name, likewise
	Created  time.Time  `json:"created"`
	Checksum string     `json:"checksum"`
	Entry    cacheEntry `json:"entry"`
}

// Check verifies the checksum of an envelope read from disk.
func (e *cacheEnvelope) Check() error {
	if e.Checksum != entryChecksum(e.Entry) {
		return errors.New("checksum mismatch")
	}
	return nil
}

// openCache prepares the cache directory: created in read-write mode, and
// required to exist in read-only mode; nil when the cache is off.
func openCache(dir string, mode CacheMode, log *slog.Logger) (*diskCache, error) {
	if mode == CacheOff {
		return nil, nil
	}
	c, err := diskcache.Open(diskcache.Config{Dir: dir, Version: cacheVersion, ReadOnly: mode == CacheReadOnly,
		Log: log, Owner: "llmpool"})
	if err != nil {
		return nil, fmt.Errorf("llmpool: pool.cache_dir: %w", err)
	}
	return &diskCache{c: c}, nil
}

// cacheKeyOf hashes the provider name and the provider's key parts.
func cacheKeyOf(providerName string, parts any) (string, error) {
	k, err := diskcache.Key(struct {
		Version  int    `json:"v"`
		Provider string `json:"provider"`
		Request  any    `json:"request"`
	}{cacheVersion, providerName, parts})
	if err != nil {
		return "", fmt.Errorf("llmpool: cache key: %w", err)
	}
	return k, nil
}

func entryChecksum(e cacheEntry) string {
	b, _ := json.Marshal(e) // a struct of strings, ints and a bool always encodes
	return diskcache.Checksum(b)
}

// get returns the entry of key. A missing file is a miss; an unreadable or
// invalid one is a miss, and is removed unless the cache is read-only.
func (c *diskCache) get(key string) (cacheEntry, bool) {
	var env cacheEnvelope
	if !c.c.Get(key, &env) {
		return cacheEntry{}, false
	}
	return env.Entry, true
}

// put writes the entry of key atomically. A read-only cache refuses with
// errCacheReadOnly.
func (c *diskCache) put(key, model, providerName string, e cacheEntry) error {
	err := c.c.Put(key, &cacheEnvelope{Model: model, Provider: providerName,
		Created: time.Now().UTC(), Checksum: entryChecksum(e), Entry: e})
	if err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	return nil
}

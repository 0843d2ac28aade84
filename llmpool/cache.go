package llmpool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// cacheVersion is bumped when the key or the entry format changes; older
// entries then simply miss.
const cacheVersion = 1

// diskCache is the response cache in front of every provider: one JSON file
// per reply, at DIR/KK/KEY.json where KEY is the SHA-256 (hex) of the
// provider name and the provider's cache key (cacheKey: for openai the
// endpoint, model id, request parameters and messages; for sim the model's
// settings, the question and the sub-query) and KK its first two
// characters. The API key is never part of it.
//
// Writes go to a temporary file in the same directory (".tmp-*"), are
// fsynced and renamed over the entry, so readers, concurrent writers of the
// same key (goroutines or processes) and a kill -9 only ever see a whole
// entry or none. Reads verify the envelope (version, key, checksum of the
// entry); a file that fails is a miss, and in read-write mode it is removed
// (the fresh reply then takes its place). In read-only mode the cache never
// creates, changes or removes anything on disk. Stray ".tmp-*" files left
// by a crash are never read and may be deleted.
//
// Stored texts are valid UTF-8 (Pool.Call normalises replies with validText
// before storing them), so a hit returns the very bytes the fresh call did.
type diskCache struct {
	dir      string
	readOnly bool
	log      *slog.Logger
}

// errCacheReadOnly: put was called on a read-only cache (a bug in the
// caller; Pool.Call never does).
var errCacheReadOnly = errors.New("llmpool: cache: read-only, nothing is written")

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
	Version  int        `json:"version"`
	Key      string     `json:"key"`
	Model    string     `json:"model"`    // pool model name, for people reading the files
	Provider string     `json:"provider"` // provider name, likewise
	Created  time.Time  `json:"created"`
	Checksum string     `json:"checksum"`
	Entry    cacheEntry `json:"entry"`
}

// openCache prepares the cache directory: created in read-write mode, and
// required to exist in read-only mode.
func openCache(dir string, mode CacheMode, log *slog.Logger) (*diskCache, error) {
	switch mode {
	case CacheOff:
		return nil, nil
	case CacheReadOnly:
		fi, err := os.Stat(dir)
		if err != nil {
			return nil, fmt.Errorf("llmpool: pool.cache_dir %q: %w (pool.cache is read-only, so it must exist)", dir, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("llmpool: pool.cache_dir %q: not a directory", dir)
		}
	default:
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("llmpool: pool.cache_dir: %w", err)
		}
	}
	return &diskCache{dir: dir, readOnly: mode == CacheReadOnly, log: log}, nil
}

// cacheKeyOf hashes the provider name and the provider's key parts.
func cacheKeyOf(providerName string, parts any) (string, error) {
	b, err := json.Marshal(struct {
		Version  int    `json:"v"`
		Provider string `json:"provider"`
		Request  any    `json:"request"`
	}{cacheVersion, providerName, parts})
	if err != nil {
		return "", fmt.Errorf("llmpool: cache key: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func (c *diskCache) path(key string) string {
	return filepath.Join(c.dir, key[:2], key+".json")
}

func entryChecksum(e cacheEntry) string {
	b, _ := json.Marshal(e) // a struct of strings, ints and a bool always encodes
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// get returns the entry of key. A missing file is a miss; an unreadable or
// invalid one is a miss, and is removed unless the cache is read-only.
func (c *diskCache) get(key string) (cacheEntry, bool) {
	p := c.path(key)
	b, err := os.ReadFile(p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("llmpool: cache read failed", slog.String("path", p), slog.String("err", err.Error()))
		}
		return cacheEntry{}, false
	}
	var env cacheEnvelope
	err = json.Unmarshal(b, &env)
	switch {
	case err != nil:
	case env.Version != cacheVersion:
		err = fmt.Errorf("version %d, want %d", env.Version, cacheVersion)
	case env.Key != key:
		err = fmt.Errorf("key mismatch")
	case env.Checksum != entryChecksum(env.Entry):
		err = fmt.Errorf("checksum mismatch")
	}
	if err != nil {
		if c.readOnly {
			c.log.Warn("llmpool: invalid cache entry ignored (read-only cache, left in place)",
				slog.String("path", p), slog.String("err", err.Error()))
			return cacheEntry{}, false
		}
		c.log.Warn("llmpool: invalid cache entry removed", slog.String("path", p), slog.String("err", err.Error()))
		if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			c.log.Warn("llmpool: cache remove failed", slog.String("path", p), slog.String("err", rerr.Error()))
		}
		return cacheEntry{}, false
	}
	return env.Entry, true
}

// put writes the entry of key atomically: temp file, fsync, rename. A
// read-only cache refuses with errCacheReadOnly.
func (c *diskCache) put(key, model, providerName string, e cacheEntry) (err error) {
	if c.readOnly {
		return errCacheReadOnly
	}
	p := c.path(key)
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	b, err := json.Marshal(cacheEnvelope{
		Version: cacheVersion, Key: key, Model: model, Provider: providerName,
		Created: time.Now().UTC(), Checksum: entryChecksum(e), Entry: e,
	})
	if err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(b); err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	if err = os.Rename(tmp, p); err != nil {
		return fmt.Errorf("llmpool: cache: %w", err)
	}
	// Make the rename durable; a failure here loses at most this entry.
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

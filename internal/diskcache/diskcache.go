// Package diskcache is the on-disk cache of recal's providers (llmpool's
// replies, embed's vectors): one JSON file per entry, at DIR/KK/KEY.json
// where KEY is the SHA-256 (hex) of what decides the entry (Key) and KK its
// first two characters.
//
// Writes go to a temporary file in the same directory (".tmp-*"), are
// fsynced and renamed over the entry, so readers, concurrent writers of the
// same key (goroutines or processes) and a kill -9 only ever see a whole
// entry or none. Reads verify the envelope: the cache's version, the key,
// and the caller's check of its own content (a checksum); a file that fails
// is a miss, and in read-write mode it is removed (the fresh value then
// takes its place). In read-only mode the cache never creates, changes or
// removes anything on disk. Stray ".tmp-*" files left by a crash are never
// read and may be deleted.
package diskcache

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

	"github.com/recal-project/recal/internal/inputfile"
)

// ErrReadOnly: Put was called on a read-only cache.
var ErrReadOnly = errors.New("cache: read-only, nothing is written")

// Header is the part of an entry the cache checks itself. An entry type
// embeds it first, so that every file starts with its version and key.
type Header struct {
	Version int    `json:"version"`
	Key     string `json:"key"`
}

func (h *Header) header() *Header { return h }

// Entry is a pointer to a caller's entry type: a struct embedding Header.
type Entry interface {
	header() *Header
	// Check reports what is wrong with the content of an entry read from a
	// file (a checksum that does not match), or nil.
	Check() error
}

// Config says where a cache lives and how it behaves.
type Config struct {
	// Dir is the cache folder: created unless ReadOnly, which requires it.
	Dir string
	// Version is the entry format's version; an entry of another is a miss.
	Version int
	// ReadOnly: Get only, and never remove an invalid entry.
	ReadOnly bool
	// Log receives unreadable, invalid and removed entries.
	Log *slog.Logger
	// Owner is the package named in log lines ("llmpool", "embed").
	Owner string
}

// Cache is an open cache folder. Its methods are safe for concurrent use,
// by goroutines and by processes sharing the folder.
type Cache struct {
	cfg Config
}

// Open prepares the folder: created in read-write mode, required to exist
// in read-only mode. Errors name the folder; the caller names its setting.
func Open(cfg Config) (*Cache, error) {
	if cfg.ReadOnly {
		fi, err := os.Stat(cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("%w (the cache is read-only, so it must exist)", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s: not a directory", cfg.Dir)
		}
	} else if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	return &Cache{cfg: cfg}, nil
}

// Key is the SHA-256 (hex) of the JSON encoding of parts: everything that
// decides an entry, the caller's format version included, and never a
// secret.
func Key(parts any) (string, error) {
	b, err := json.Marshal(parts)
	if err != nil {
		return "", err
	}
	return Checksum(b), nil
}

// Checksum is the SHA-256 (hex) of b.
func Checksum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// maxEntryBytes bounds an entry file read by Get: an entry holds one reply,
// far smaller. A larger file, or one that is not a regular file (a FIFO
// would block the read), is a miss that is logged.
const maxEntryBytes = 64 << 20

func (c *Cache) path(key string) string {
	return filepath.Join(c.cfg.Dir, key[:2], key+".json")
}

// Get reads key's entry into e and reports whether it is there and valid.
// A missing file is a miss; an unreadable or invalid one (not JSON, another
// version or key, e.Check failing) is a miss that is logged, and removed
// unless the cache is read-only.
func (c *Cache) Get(key string, e Entry) bool {
	p := c.path(key)
	b, err := inputfile.ReadFile(p, maxEntryBytes)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.cfg.Log.Warn(c.cfg.Owner+": cache read failed", slog.String("path", p), slog.String("err", err.Error()))
		}
		return false
	}
	err = json.Unmarshal(b, e)
	h := e.header()
	switch {
	case err != nil:
	case h.Version != c.cfg.Version:
		err = fmt.Errorf("version %d, want %d", h.Version, c.cfg.Version)
	case h.Key != key:
		err = errors.New("key mismatch")
	default:
		err = e.Check()
	}
	if err == nil {
		return true
	}
	if c.cfg.ReadOnly {
		c.cfg.Log.Warn(c.cfg.Owner+": invalid cache entry ignored (read-only cache, left in place)",
			slog.String("path", p), slog.String("err", err.Error()))
		return false
	}
	c.cfg.Log.Warn(c.cfg.Owner+": invalid cache entry removed", slog.String("path", p), slog.String("err", err.Error()))
	if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		c.cfg.Log.Warn(c.cfg.Owner+": cache remove failed", slog.String("path", p), slog.String("err", rerr.Error()))
	}
	return false
}

// Put sets e's Header to the cache's version and key and writes e as key's
// entry atomically: temp file, fsync, rename, fsync of the folder. A
// read-only cache refuses with ErrReadOnly.
func (c *Cache) Put(key string, e Entry) (err error) {
	if c.cfg.ReadOnly {
		return ErrReadOnly
	}
	*e.header() = Header{Version: c.cfg.Version, Key: key}
	p := c.path(key)
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(b); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, p); err != nil {
		return err
	}
	// Make the rename durable; a failure here loses at most this entry.
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

package embed

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
)

// diskVersion is bumped when the key or the file format changes; older
// files then miss.
const diskVersion = 1

// diskCache stores vectors one file per text at DIR/KK/KEY.json, KEY being
// the SHA-256 (hex) of the provider, endpoint, model, requested dimensions
// and text (never the API key) and KK its first two characters, as the
// pool's response cache does. A file is written to a temporary file in the
// same folder, fsynced and renamed, so readers and a kill -9 see a whole
// entry or none; a read checks version, key and a checksum of the vector,
// and a bad file is a miss (removed unless read-only). Vectors are stored
// as base64 of little-endian float32, so a hit returns the very bits the
// provider sent.
type diskCache struct {
	dir      string
	readOnly bool
	log      *slog.Logger
}

// diskEntry is the file format.
type diskEntry struct {
	Version  int    `json:"version"`
	Key      string `json:"key"`
	Model    string `json:"model"` // for people reading the files
	Dim      int    `json:"dim"`
	Checksum string `json:"checksum"` // SHA-256 (hex) of the vector's bytes
	Vector   string `json:"vector"`   // base64 of little-endian float32
}

// openDisk prepares the cache folder; "" or mode off means no disk cache.
func openDisk(dir, mode string, log *slog.Logger) (*diskCache, error) {
	if dir == "" || mode == CacheOff {
		if mode == CacheReadOnly {
			return nil, fmt.Errorf("embed: embedding.cache is read-only but no cache folder is given")
		}
		return nil, nil
	}
	if mode == CacheReadOnly {
		fi, err := os.Stat(dir)
		if err != nil {
			return nil, fmt.Errorf("embed: cache folder %q: %w (embedding.cache is read-only, so it must exist)", dir, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("embed: cache folder %q: not a directory", dir)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embed: cache folder: %w", err)
	}
	return &diskCache{dir: dir, readOnly: mode == CacheReadOnly, log: log}, nil
}

// diskKey hashes what decides a vector.
func diskKey(provider, endpoint, model string, dimensions int, text string) string {
	b, _ := json.Marshal(struct {
		V          int    `json:"v"`
		Provider   string `json:"provider"`
		Endpoint   string `json:"endpoint"`
		Model      string `json:"model"`
		Dimensions int    `json:"dimensions"`
		Text       string `json:"text"`
	}{diskVersion, provider, endpoint, model, dimensions, text}) // strings and ints always encode
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (c *diskCache) path(key string) string { return filepath.Join(c.dir, key[:2], key+".json") }

func vectorBytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// get returns the vector of key, or false on a miss.
func (c *diskCache) get(key string) ([]float32, bool) {
	p := c.path(key)
	raw, err := os.ReadFile(p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("embed: cache read failed", "path", p, "err", err)
		}
		return nil, false
	}
	var e diskEntry
	var b []byte
	err = json.Unmarshal(raw, &e)
	if err == nil {
		b, err = base64.StdEncoding.DecodeString(e.Vector)
	}
	switch {
	case err != nil:
	case e.Version != diskVersion:
		err = fmt.Errorf("version %d, want %d", e.Version, diskVersion)
	case e.Key != key:
		err = errors.New("key mismatch")
	case len(b) != 4*e.Dim || e.Dim == 0:
		err = fmt.Errorf("%d bytes for %d dimensions", len(b), e.Dim)
	default:
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != e.Checksum {
			err = errors.New("checksum mismatch")
		}
	}
	if err != nil {
		if c.readOnly {
			c.log.Warn("embed: invalid cache entry ignored (read-only cache)", "path", p, "err", err)
			return nil, false
		}
		c.log.Warn("embed: invalid cache entry removed", "path", p, "err", err)
		os.Remove(p)
		return nil, false
	}
	v := make([]float32, e.Dim)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, true
}

// put writes the vector of key atomically.
func (c *diskCache) put(key, model string, v []float32) (err error) {
	if c.readOnly {
		return errors.New("embed: cache is read-only")
	}
	p := c.path(key)
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	b := vectorBytes(v)
	sum := sha256.Sum256(b)
	raw, err := json.Marshal(diskEntry{Version: diskVersion, Key: key, Model: model, Dim: len(v),
		Checksum: hex.EncodeToString(sum[:]), Vector: base64.StdEncoding.EncodeToString(b)})
	if err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(raw); err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	if err = os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	return nil
}

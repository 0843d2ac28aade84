package embed

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"

	"github.com/recal-project/recal/internal/diskcache"
)

// diskVersion is bumped when the key or the file format changes; older
// files then miss.
const diskVersion = 1

// diskCache stores vectors in a diskcache.Cache (one file per text, written
// atomically, verified on read, a bad file a miss that is removed unless
// read-only), KEY being the SHA-256 (hex) of the provider, endpoint, model,
// requested dimensions and text (never the API key), as the pool's
// response cache does. Vectors are stored as base64 of little-endian
// float32, so a hit returns the very bits the provider sent.
type diskCache struct {
	c *diskcache.Cache
}

// diskEntry is the file format.
type diskEntry struct {
	diskcache.Header
	Model    string `json:"model"` // for people reading the files
	Dim      int    `json:"dim"`
	Checksum string `json:"checksum"` // SHA-256 (hex) of the vector's bytes
	Vector   string `json:"vector"`   // base64 of little-endian float32

	vector []float32 // decoded by Check
}

// Check decodes the vector of an entry read from disk and verifies its
// length and checksum.
func (e *diskEntry) Check() error {
	b, err := base64.StdEncoding.DecodeString(e.Vector)
	switch {
	case err != nil:
		return err
	case len(b) != 4*e.Dim || e.Dim == 0:
		return fmt.Errorf("%d bytes for %d dimensions", len(b), e.Dim)
	case diskcache.Checksum(b) != e.Checksum:
		return errors.New("checksum mismatch")
	}
	e.vector = make([]float32, e.Dim)
	for i := range e.vector {
		e.vector[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}

// openDisk prepares the cache folder; "" or mode off means no disk cache.
func openDisk(dir, mode string, log *slog.Logger) (*diskCache, error) {
	if dir == "" || mode == CacheOff {
		if mode == CacheReadOnly {
			return nil, fmt.Errorf("embed: embedding.cache is read-only but no cache folder is given")
		}
		return nil, nil
	}
	c, err := diskcache.Open(diskcache.Config{Dir: dir, Version: diskVersion, ReadOnly: mode == CacheReadOnly,
		Log: log, Owner: "embed"})
	if err != nil {
		return nil, fmt.Errorf("embed: cache folder: %w", err)
	}
	return &diskCache{c: c}, nil
}

// diskKey hashes what decides a vector.
func diskKey(provider, endpoint, model string, dimensions int, text string) string {
	k, _ := diskcache.Key(struct {
		V          int    `json:"v"`
		Provider   string `json:"provider"`
		Endpoint   string `json:"endpoint"`
		Model      string `json:"model"`
		Dimensions int    `json:"dimensions"`
		Text       string `json:"text"`
	}{diskVersion, provider, endpoint, model, dimensions, text}) // strings and ints always encode
	return k
}

func vectorBytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// get returns the vector of key, or false on a miss.
func (c *diskCache) get(key string) ([]float32, bool) {
	var e diskEntry
	if !c.c.Get(key, &e) {
		return nil, false
	}
	return e.vector, true
}

// put writes the vector of key atomically.
func (c *diskCache) put(key, model string, v []float32) error {
	b := vectorBytes(v)
	err := c.c.Put(key, &diskEntry{Model: model, Dim: len(v), Checksum: diskcache.Checksum(b),
		Vector: base64.StdEncoding.EncodeToString(b)})
	if err != nil {
		return fmt.Errorf("embed: cache: %w", err)
	}
	return nil
}

package procgroup

import (
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
)

// AllGatherOf returns every rank's v, in rank order. Values travel gob
// encoded: strings keep their bytes (text cut inside a UTF-8 sequence stays
// as it was) and floats their bits, so every rank decodes exactly what each
// rank had.
func AllGatherOf[T any](ctx context.Context, g Group, v T) ([]T, error) {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&v); err != nil {
		return nil, fmt.Errorf("dist: encode %T: %w", v, err)
	}
	parts, err := g.AllGather(ctx, buf.Bytes())
	if err != nil {
		return nil, err
	}
	out := make([]T, len(parts))
	for i, p := range parts {
		if err := gob.NewDecoder(bytes.NewReader(p)).Decode(&out[i]); err != nil {
			return nil, fmt.Errorf("dist: decode %T from rank %d: %w", v, i, err)
		}
	}
	return out, nil
}

// BroadcastOf returns root's v on every rank (v is read on root only), gob
// encoded like AllGatherOf.
func BroadcastOf[T any](ctx context.Context, g Group, v T, root int) (T, error) {
	var buf bytes.Buffer
	var out T
	if g.Rank() == root {
		if err := gob.NewEncoder(&buf).Encode(&v); err != nil {
			return out, fmt.Errorf("dist: encode %T: %w", v, err)
		}
	}
	b, err := g.Broadcast(ctx, buf.Bytes(), root)
	if err != nil {
		return out, err
	}
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&out); err != nil {
		return out, fmt.Errorf("dist: decode %T from rank %d: %w", v, root, err)
	}
	return out, nil
}

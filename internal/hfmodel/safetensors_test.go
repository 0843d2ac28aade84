package hfmodel

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenWeightsFileRefusesBadHeaders(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		data         int // bytes of data after the header
		want         string
	}{
		{"element count past int64", `{"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, 0,
			`tensor "x": shape [4611686018427387904 4] has more than 9223372036854775807 elements`},
		{"byte count past int64", `{"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}}`, 0,
			`tensor "x": 0 bytes for shape [4611686018427387904] of F32, want more than fits in int64`},
		{"wrong byte count", `{"x":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}}`, 8,
			`tensor "x": 8 bytes for shape [2 3] of BF16, want 12`},
		{"negative dimension", `{"x":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}}`, 16,
			`tensor "x": negative dimension in shape [-1 -4]`},
		{"past the data", `{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 3,
			`tensor "x" ends at byte 4 of the data, which has 3 bytes`},
		// The tensors must tile the data section: shared bytes or bytes of
		// no tensor mean a forged or corrupt header.
		{"overlapping tensors", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12,
			`tensor "b" (data bytes 4 to 12) overlaps tensor "a"`},
		{"the same bytes twice", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8,
			`overlaps tensor`},
		{"a gap", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, 12,
			`data bytes 4 to 8, before tensor "b", belong to no tensor`},
		{"a gap at the start", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8, `data bytes 0 to 4, before tensor "a", belong to no tensor`},
		{"bytes past the last tensor", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 9, `data bytes 4 to 9, at the end, belong to no tensor`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "model.safetensors")
			if err := os.WriteFile(path, safetensorsFile(tc.header, make([]byte, tc.data)), 0o644); err != nil {
				t.Fatal(err)
			}
			w, err := OpenWeightsFile(path)
			if err == nil {
				w.Close()
				t.Fatalf("OpenWeightsFile accepted header %s; want an error containing %q (the shape cannot describe the stored bytes)", tc.header, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q; want it to name the file and contain %q", err, tc.want)
			}
		})
	}
}

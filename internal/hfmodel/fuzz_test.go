package hfmodel

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// safetensorsFile builds a file from a header text and a data section, with
// the length prefix the header has.
func safetensorsFile(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// FuzzOpenWeightsFile opens arbitrary bytes as a safetensors file. A
// checkpoint may come from anywhere: no input may panic or make the reader
// allocate more than the file holds, every error names the file, and every
// tensor it accepts lies inside the file with exactly the bytes its shape
// and dtype need.
func FuzzOpenWeightsFile(f *testing.F) {
	dir := f.TempDir()
	valid := filepath.Join(dir, "valid.safetensors")
	specs := []TensorSpec{{Name: "a", DType: "F32", Shape: []int64{2, 3}}, {Name: "b", DType: "BF16", Shape: []int64{}}, {Name: "c", DType: "F16", Shape: []int64{0, 5}}}
	if err := WriteSafetensors(valid, specs, map[string]string{"format": "pt"}, func(i int, buf []byte) error {
		for j := range buf {
			buf[j] = byte(i + j)
		}
		return nil
	}); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(valid)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add(good[:8])
	f.Add([]byte{})
	f.Add(safetensorsFile(`{"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, nil))
	f.Add(safetensorsFile(`{"x":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}}`, make([]byte, 16)))
	f.Add(safetensorsFile(`{"x":{"dtype":"I8","shape":[3],"data_offsets":[0,3]},"__metadata__":{"k":"v"}}`, []byte{1, 2, 3}))
	f.Add(safetensorsFile(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[9223372036854775807,9223372036854775807]}}`, nil))
	f.Add(safetensorsFile(`{"__metadata__":{"k":1}}`, nil))
	f.Add(safetensorsFile(`null`, nil))
	f.Add(binary.LittleEndian.AppendUint64(nil, math.MaxUint64))
	f.Add(safetensorsFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12)))
	f.Add(safetensorsFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, make([]byte, 12)))
	f.Add(safetensorsFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 9)))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "model.safetensors")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		w, err := OpenWeightsFile(path)
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "hfmodel: ") || !strings.Contains(msg, path) {
				t.Fatalf("error %q must start with hfmodel: and name the file", msg)
			}
			return
		}
		defer w.Close()
		// The tensors tile the data section: sorted by offset, each begins
		// where the one before ends, the first at the data's start and the
		// last at the file's end (no byte shared, none left over).
		var ts []*Tensor
		for _, name := range w.Names() {
			tn, _ := w.Lookup(name)
			ts = append(ts, tn)
		}
		slices.SortFunc(ts, func(x, y *Tensor) int { return cmp.Or(cmp.Compare(x.begin, y.begin), cmp.Compare(x.size, y.size)) })
		if len(ts) > 0 {
			n := int64(binary.LittleEndian.Uint64(b))
			at := 8 + n
			for _, tn := range ts {
				if tn.begin != at {
					t.Fatalf("tensor %q begins at byte %d, want %d: tensors overlap or leave a gap", tn.Name, tn.begin, at)
				}
				at += tn.size
			}
			if at != int64(len(b)) {
				t.Fatalf("the tensors end at byte %d of a %d-byte file: bytes of no tensor", at, len(b))
			}
		}
		for _, name := range w.Names() {
			tn, _ := w.Lookup(name)
			if tn.begin < 8 || tn.size < 0 || tn.begin+tn.size > int64(len(b)) {
				t.Fatalf("tensor %q: bytes [%d, %d) of a %d-byte file", name, tn.begin, tn.begin+tn.size, len(b))
			}
			es, ok := DTypeSize[tn.DType]
			if !ok {
				if _, err := w.Read(tn); err == nil {
					t.Fatalf("Read of tensor %q of dtype %q succeeded; want an unsupported-dtype error", name, tn.DType)
				}
				continue
			}
			n := es
			for _, d := range tn.Shape {
				hi, lo := bits.Mul64(uint64(n), uint64(d))
				if d < 0 || hi != 0 || lo > math.MaxInt64 {
					t.Fatalf("tensor %q: shape %v of %s accepted, but its byte size overflows int64 (%d bytes stored)", name, tn.Shape, tn.DType, tn.size)
				}
				n = int64(lo)
			}
			if n != tn.size || tn.Numel()*es != tn.size {
				t.Fatalf("tensor %q: shape %v of %s needs %d bytes, %d stored", name, tn.Shape, tn.DType, n, tn.size)
			}
			data, err := w.Read(tn)
			if err != nil || int64(len(data)) != tn.size || !bytes.Equal(data, b[tn.begin:tn.begin+tn.size]) {
				t.Fatalf("Read(%q) = %d bytes, %v; want the %d bytes at offset %d", name, len(data), err, tn.size, tn.begin)
			}
		}
	})
}

// FuzzParseConfig parses arbitrary config.json bytes: no panic, errors that
// name the file, and a config that survives MarshalJSON and a second parse
// unchanged, with sizes whose weight matrices can be counted in int64.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":151936,"hidden_size":2048,"intermediate_size":11008,"num_hidden_layers":36,"num_attention_heads":16,"num_key_value_heads":2,"max_position_embeddings":32768,"rope_theta":1000000.0,"rms_norm_eps":1e-06,"tie_word_embeddings":true,"torch_dtype":"bfloat16","bos_token_id":151643,"eos_token_id":151645,"use_sliding_window":false,"sliding_window":32768}`,
		`{"model_type":"qwen2","vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"eos_token_id":[1,2],"head_dim":4}`,
		`{"model_type":"qwen2","vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":null,"eos_token_id":null,"rope_scaling":null}`,
		`{"model_type":"qwen2","vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"head_dim":-2}`,
		`{"model_type":"qwen2","vocab_size":4611686018427387904,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2}`,
		`{"model_type":"qwen2","vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"rope_scaling":{"type":"yarn"}}`,
		`{"model_type":"llama"}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig("config.json", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "hfmodel: config.json: ") {
				t.Fatalf("error %q must start with hfmodel: config.json:", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseConfig accepted a config that Validate refuses: %v", err)
		}
		if c.HeadDim < 0 {
			t.Fatalf("ParseConfig accepted head_dim %d", c.HeadDim)
		}
		hd := c.HeadDimension()
		for _, m := range [][2]int64{{c.VocabSize, c.HiddenSize}, {c.IntermediateSize, c.HiddenSize},
			{c.NumAttentionHeads, hd}, {c.NumKeyValueHeads, hd}, {c.NumHiddenLayers, c.HiddenSize}, {c.MaxPositionEmbeddings, hd}} {
			if hi, lo := bits.Mul64(uint64(m[0]), uint64(m[1])); m[0] <= 0 || m[1] <= 0 || hi != 0 || lo > math.MaxInt64/4 {
				t.Fatalf("ParseConfig accepted sizes %d × %d, whose float32 byte count does not fit int64 (config %s)", m[0], m[1], b)
			}
		}
		out, err := c.MarshalJSON()
		if err != nil {
			t.Fatalf("MarshalJSON of a parsed config: %v", err)
		}
		if !json.Valid(out) {
			t.Fatalf("MarshalJSON wrote invalid JSON %s", out)
		}
		c2, err := ParseConfig("config.json", out)
		if err != nil {
			t.Fatalf("reparsing MarshalJSON's %s: %v (the input was %s)", out, err, b)
		}
		if len(c.EOSTokenIDs) == 0 && len(c2.EOSTokenIDs) == 0 {
			c2.EOSTokenIDs = c.EOSTokenIDs // [] and absent mean the same
		}
		if !reflect.DeepEqual(compact(t, c), compact(t, c2)) {
			t.Fatalf("config changed through MarshalJSON:\n in  %s\n out %s\n%+v\n%+v", b, out, c, c2)
		}
	})
}

// compact returns c with its Extra values compacted, for comparison.
func compact(t *testing.T, c *Config) Config {
	t.Helper()
	cc := *c
	cc.Extra = map[string]json.RawMessage{}
	for k, v := range c.Extra {
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			t.Fatalf("Extra[%q] = %s is not JSON: %v", k, v, err)
		}
		cc.Extra[k] = buf.Bytes()
	}
	return cc
}

// FuzzVerifyChecksums reads arbitrary bytes as a checkpoint's
// checksums.sha256 beside two files. No input panics or names a file
// outside the folder; errors name the checksum file or the file that
// differs; the names it accepts are files of the folder whose SHA-256 the
// list gives.
func FuzzVerifyChecksums(f *testing.F) {
	dir := f.TempDir()
	files := map[string]string{"config.json": "{}", "model.safetensors": "weights"}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := WriteChecksums(dir); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, ChecksumFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(strings.Repeat("0", 64) + "  ../../etc/passwd\n"))
	f.Add([]byte(strings.Repeat("g", 64) + "  config.json\n"))
	f.Add(append(append([]byte{}, good...), good...))
	f.Add([]byte("\n\n  \n"))
	f.Fuzz(func(t *testing.T, list []byte) {
		d := t.TempDir()
		for name, text := range files {
			if err := os.WriteFile(filepath.Join(d, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, ChecksumFile), list, 0o644); err != nil {
			t.Fatal(err)
		}
		names, err := VerifyChecksums(d, nil)
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "hfmodel: ") || !strings.Contains(msg, d) {
				t.Fatalf("error %q must start with hfmodel: and name a file of the folder", msg)
			}
			return
		}
		for _, n := range names {
			text, ok := files[n]
			if !ok {
				t.Fatalf("accepted %q, not a file of the folder", n)
			}
			sum := sha256.Sum256([]byte(text))
			if !strings.Contains(strings.ToLower(string(list)), hex.EncodeToString(sum[:])+"  "+n) {
				t.Fatalf("accepted %q, whose SHA-256 the list does not give", n)
			}
		}
	})
}

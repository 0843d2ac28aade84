package torchbridge_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// savedTiny writes a tiny random checkpoint and returns its folder.
func savedTiny(t *testing.T, tied bool) (string, *torchbridge.Policy) {
	t.Helper()
	p := newTiny(t, 61, tied, 5)
	dir := filepath.Join(t.TempDir(), "ck")
	if err := p.Save(dir); err != nil {
		t.Fatalf("Save: %v", err)
	}
	return dir, p
}

func scoreOf(t *testing.T, p *torchbridge.Policy) []float32 {
	t.Helper()
	lp, _, err := p.Score(context.Background(), [][]int32{{1, 5, 9, 33, 2, 60, 7}})
	if err != nil {
		t.Fatal(err)
	}
	return lp[0]
}

// rewriteWeights re-encodes a checkpoint's tensors through edit, which may
// rename, drop, reshape or retype them.
func rewriteWeights(t *testing.T, dir string, edit func(specs []hfmodel.TensorSpec, data [][]byte) ([]hfmodel.TensorSpec, [][]byte)) {
	t.Helper()
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	var specs []hfmodel.TensorSpec
	var data [][]byte
	for _, n := range w.Names() {
		tn, _ := w.Lookup(n)
		b, err := w.Read(tn)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, hfmodel.TensorSpec{Name: n, DType: tn.DType, Shape: tn.Shape})
		data = append(data, b)
	}
	w.Close()
	specs, data = edit(specs, data)
	err = hfmodel.WriteSafetensors(filepath.Join(dir, "model.safetensors"), specs, nil, func(i int, buf []byte) error {
		copy(buf, data[i])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	unchecked(t, dir)
}

// unchecked removes the checksums of a folder edited by hand: it then
// loads as a Hugging Face folder from elsewhere.
func unchecked(t *testing.T, dir string) {
	t.Helper()
	if err := os.Remove(filepath.Join(dir, hfmodel.ChecksumFile)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	for _, tied := range []bool{true, false} {
		dir, p := savedTiny(t, tied)
		want := scoreOf(t, p)
		q, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{}))
		if err != nil {
			t.Fatalf("tied=%v: LoadPolicy: %v", tied, err)
		}
		got := scoreOf(t, q)
		q.Close()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("tied=%v: token %d log-prob %v after save+load, want %v", tied, i, got[i], want[i])
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "lm_head.weight")); err == nil {
			t.Fatal("unexpected file")
		}
	}
}

// A tensor larger than hfmodel.ReadChunk loads in pieces (the load holds
// no whole copy of it) into exactly the tensor a whole load gives: F32 as
// saved, BF16 converted to float32, the pieces' cuts anywhere in a row.
func TestLoadInPieces(t *testing.T) {
	const vocab = 300_000 // untied: embedding and head of 300,000 × 32, 38.4 MB in F32 (3 pieces), 19.2 MB in BF16 (2)
	p := newTiny(t, vocab, false, 7)
	dir := filepath.Join(t.TempDir(), "ck")
	if err := p.Save(dir); err != nil {
		t.Fatal(err)
	}
	param := func(p *torchbridge.Policy, name string) []byte {
		t.Helper()
		b := make([]byte, vocab*32*4)
		if err := p.GetParam(name, "F32", b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	names := []string{"model.embed_tokens.weight", "lm_head.weight"}
	for _, dtype := range []string{"F32", "BF16"} {
		if dtype == "BF16" {
			rewriteWeights(t, dir, func(specs []hfmodel.TensorSpec, data [][]byte) ([]hfmodel.TensorSpec, [][]byte) {
				for i := range specs { // F32 → BF16 by truncation
					out := make([]byte, len(data[i])/2)
					for k := 0; k < len(out)/2; k++ {
						out[2*k], out[2*k+1] = data[i][4*k+2], data[i][4*k+3]
					}
					specs[i].DType, data[i] = "BF16", out
				}
				return specs, data
			})
		}
		q, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{}))
		if err != nil {
			t.Fatalf("%s: %v", dtype, err)
		}
		for _, name := range names {
			want := param(p, name)
			if dtype == "BF16" { // what the file holds, widened exactly
				for k := 0; k < len(want); k += 4 {
					want[k], want[k+1] = 0, 0
				}
			}
			if got := param(q, name); !bytes.Equal(got, want) {
				t.Errorf("%s: %s loaded in pieces differs from the saved tensor", dtype, name)
			}
		}
		q.Close()
	}
}

// Half-precision files load into a float32 policy (converted), and a
// bfloat16 policy runs and saves as BF16.
func TestDTypes(t *testing.T) {
	dir, p := savedTiny(t, true)
	want := scoreOf(t, p)
	rewriteWeights(t, dir, func(specs []hfmodel.TensorSpec, data [][]byte) ([]hfmodel.TensorSpec, [][]byte) {
		for i := range specs { // F32 → BF16 by truncation (exactly representable after)
			out := make([]byte, len(data[i])/2)
			for k := 0; k < len(out)/2; k++ {
				out[2*k] = data[i][4*k+2]
				out[2*k+1] = data[i][4*k+3]
			}
			specs[i].DType, data[i] = "BF16", out
		}
		return specs, data
	})
	q, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	got := scoreOf(t, q)
	q.Close()
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 0.05 {
			t.Fatalf("token %d: BF16-loaded log-prob %v, F32 %v: conversion is wrong", i, got[i], want[i])
		}
	}
	b, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{DType: "bfloat16"}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got = scoreOf(t, b)
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 0.1 {
			t.Fatalf("token %d: bfloat16 policy log-prob %v, float32 %v", i, got[i], want[i])
		}
	}
	// One row, one token at a time: the cache's single-row output head.
	seq := []int32{1, 5, 9, 33, 2, 60, 7}
	c, err := b.NewCache(1, len(seq))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i+1 < len(seq); i++ {
		res, err := c.Extend(context.Background(), torchbridge.Step{Rows: []int{0}, Tokens: [][]int32{seq[i : i+1]}, WantLogits: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := logSoftmaxAt(res.Logits[0], seq[i+1]); math.Abs(got-float64(want[i+1])) > 0.1 {
			t.Fatalf("token %d: bfloat16 cached log-prob %v, float32 %v", i+1, got, want[i+1])
		}
	}
	out := filepath.Join(t.TempDir(), "bf16")
	if err := b.Save(out); err != nil {
		t.Fatal(err)
	}
	w, err := hfmodel.OpenWeights(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	tn, _ := w.Lookup("model.norm.weight")
	if tn.DType != "BF16" {
		t.Errorf("bfloat16 policy saved %s tensors, want BF16", tn.DType)
	}
}

func TestShardedCheckpoint(t *testing.T) {
	dir, p := savedTiny(t, false)
	want := scoreOf(t, p)
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := w.Names()
	index := map[string]string{}
	for s, part := range [][]string{names[:len(names)/2], names[len(names)/2:]} {
		file := []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}[s]
		var specs []hfmodel.TensorSpec
		for _, n := range part {
			tn, _ := w.Lookup(n)
			specs = append(specs, hfmodel.TensorSpec{Name: n, DType: tn.DType, Shape: tn.Shape})
			index[n] = file
		}
		err := hfmodel.WriteSafetensors(filepath.Join(dir, file), specs, nil, func(i int, buf []byte) error {
			tn, _ := w.Lookup(specs[i].Name)
			b, err := w.Read(tn)
			copy(buf, b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	os.Remove(filepath.Join(dir, "model.safetensors"))
	ib, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": index})
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), ib, 0o644)
	unchecked(t, dir)
	q, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{}))
	if err != nil {
		t.Fatalf("sharded load: %v", err)
	}
	defer q.Close()
	got := scoreOf(t, q)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("token %d: sharded checkpoint gives %v, want %v", i, got[i], want[i])
		}
	}
}

// Bad checkpoints give errors that name the file and the tensor or field.
func TestBadCheckpoints(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   []string
	}{
		{"missing weights", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "model.safetensors")) },
			[]string{"model.safetensors", "no such file"}},
		{"truncated weights", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model.safetensors")
			st, _ := os.Stat(path)
			os.Truncate(path, st.Size()-100)
		}, []string{"model.safetensors", "truncated", "tensor"}},
		{"truncated header", func(t *testing.T, dir string) { os.Truncate(filepath.Join(dir, "model.safetensors"), 5) },
			[]string{"model.safetensors", "truncated header"}},
		{"corrupt header", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model.safetensors")
			b, _ := os.ReadFile(path)
			copy(b[8:], []byte("{not json at all"))
			os.WriteFile(path, b, 0o644)
		}, []string{"model.safetensors", "corrupt header"}},
		{"absurd header length", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model.safetensors")
			b, _ := os.ReadFile(path)
			binary.LittleEndian.PutUint64(b, 1<<62)
			os.WriteFile(path, b, 0o644)
		}, []string{"model.safetensors", "header length"}},
		{"missing tensor", func(t *testing.T, dir string) {
			rewriteWeights(t, dir, func(s []hfmodel.TensorSpec, d [][]byte) ([]hfmodel.TensorSpec, [][]byte) {
				for i := range s {
					if s[i].Name == "model.norm.weight" {
						return append(s[:i:i], s[i+1:]...), append(d[:i:i], d[i+1:]...)
					}
				}
				return s, d
			})
		}, []string{`tensor "model.norm.weight" is missing`}},
		{"wrong shape", func(t *testing.T, dir string) {
			rewriteWeights(t, dir, func(s []hfmodel.TensorSpec, d [][]byte) ([]hfmodel.TensorSpec, [][]byte) {
				for i := range s {
					if s[i].Name == "lm_head.weight" {
						s[i].Shape = []int64{s[i].Shape[1], s[i].Shape[0]}
					}
				}
				return s, d
			})
		}, []string{`tensor "lm_head.weight"`, "shape [32 61], want [61 32]"}},
		{"unsupported dtype", func(t *testing.T, dir string) {
			// Same bytes, declared as 16 float64s instead of 32 float32s.
			path := filepath.Join(dir, "model.safetensors")
			b, _ := os.ReadFile(path)
			n := binary.LittleEndian.Uint64(b)
			var hdr map[string]map[string]any
			json.Unmarshal(b[8:8+n], &hdr)
			hdr["model.norm.weight"]["dtype"] = "F64"
			hdr["model.norm.weight"]["shape"] = []int{16}
			hb, _ := json.Marshal(hdr)
			out := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
			out = append(append(out, hb...), b[8+n:]...)
			os.WriteFile(path, out, 0o644)
		}, []string{"model.safetensors", `unsupported dtype "F64"`}},
		{"config missing field", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { delete(m, "hidden_size") })
		},
			[]string{"config.json", `required field "hidden_size"`}},
		{"unknown architecture", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["model_type"] = "llama"; m["architectures"] = []string{"LlamaForCausalLM"} })
		}, []string{"config.json", "unsupported architecture", "llama"}},
		{"config not json", func(t *testing.T, dir string) { os.WriteFile(filepath.Join(dir, "config.json"), []byte("{"), 0o644) },
			[]string{"config.json"}},
		// Hostile inputs: refused before anything is allocated for them
		// (the shapes config.json claims must be in the weights), and
		// corrupt weights are named.
		{"a million layers", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["num_hidden_layers"] = 1000000 })
		}, []string{"config.json", `field "num_hidden_layers" = 1000000: more than 1024`}},
		{"a thousand layers the weights lack", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["num_hidden_layers"] = 1000 })
		}, []string{`tensor "model.layers.2.input_layernorm.weight" is missing`, "(and 11975 more tensors)"}},
		{"hidden size the weights lack", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["hidden_size"] = 65536 })
		}, []string{`tensor "model.embed_tokens.weight": shape [61 32], want [61 65536]`}},
		{"a NaN weight", func(t *testing.T, dir string) {
			rewriteWeights(t, dir, func(s []hfmodel.TensorSpec, d [][]byte) ([]hfmodel.TensorSpec, [][]byte) {
				for i := range s {
					if s[i].Name == "model.layers.1.mlp.up_proj.weight" {
						binary.LittleEndian.PutUint32(d[i][12:], math.Float32bits(float32(math.NaN())))
					}
				}
				return s, d
			})
		}, []string{"model.safetensors", `tensor "model.layers.1.mlp.up_proj.weight": element 3 is NaN or infinite`}},
		{"flipped weight bytes", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model.safetensors")
			b, _ := os.ReadFile(path)
			for i := len(b) - 2000; i < len(b); i++ {
				b[i] ^= 0x10
			}
			os.WriteFile(path, b, 0o644)
		}, []string{"model.safetensors: SHA-256", "the file is corrupt"}},
		{"overlapping tensors", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model.safetensors")
			b, _ := os.ReadFile(path)
			n := binary.LittleEndian.Uint64(b)
			var hdr map[string]map[string]any
			json.Unmarshal(b[8:8+n], &hdr)
			// model.norm.weight read from the bytes of the embedding.
			hdr["model.norm.weight"]["data_offsets"] = []int{0, 32 * 4}
			hb, _ := json.Marshal(hdr)
			out := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
			out = append(append(out, hb...), b[8+n:]...)
			os.WriteFile(path, out, 0o644)
			unchecked(t, dir)
		}, []string{"model.safetensors", "overlaps tensor"}},
		{"bad shard index", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(`{"weight_map":{"a":"../../etc/passwd"}}`), 0o644)
		}, []string{"index.json", "plain file name"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := savedTiny(t, false)
			c.break_(t, dir)
			p, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{}))
			if err == nil {
				p.Close()
				t.Fatalf("LoadPolicy succeeded on a broken checkpoint; want an error mentioning %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func editConfig(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, _ = json.Marshal(m)
	os.WriteFile(path, b, 0o644)
	unchecked(t, dir)
}

func TestBadCalls(t *testing.T) {
	ctx := context.Background()
	p := newTiny(t, 31, true, 1)
	if _, _, err := p.Score(ctx, [][]int32{{1, 2, 99}}); err == nil || !strings.Contains(err.Error(), "token id 99") {
		t.Errorf("scoring an out-of-vocabulary token: error %v, want one naming token id 99", err)
	}
	c, err := p.NewCache(1, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(ctx, torchbridge.Step{Rows: []int{0}, Tokens: [][]int32{{1, 2, 3, 4, 5}}}); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Errorf("overfilling the cache: error %v, want a capacity error", err)
	}
	if _, err := c.Extend(ctx, torchbridge.Step{Rows: []int{3}, Tokens: [][]int32{{1}}}); err == nil || !strings.Contains(err.Error(), "row 3") {
		t.Errorf("a row outside the cache: error %v, want one naming row 3", err)
	}
	// A row given twice is refused before any share of a row-parallel call
	// could write it from two threads.
	c2, err := p.NewCache(3, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	twice := torchbridge.Step{Rows: []int{0, 1, 0, 2}, Tokens: [][]int32{{1}, {2}, {3}, {4}}, WantLogp: true, Workers: 2}
	if _, err := c2.Extend(ctx, twice); err == nil || !strings.Contains(err.Error(), "row 0 given twice") {
		t.Errorf("a row given twice: error %v, want one naming row 0", err)
	}
	if n, err := c2.Lengths(ctx); err != nil || n[0]+n[1]+n[2] != 0 {
		t.Errorf("after the refused call the rows hold %v tokens (%v), want none", n, err)
	}
	if _, err := torchbridge.NewPolicy(tinyConfig(31, true), torchbridge.Options{Device: "cuda"}); err == nil {
		if ok, _ := torchbridge.CUDAAvailable(); !ok {
			t.Error("device cuda without CUDA support: want an error")
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := p.Score(ctx, [][]int32{{1, 2}}); err == nil {
		t.Error("Score after Close: want ErrClosed")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("cache Close after policy Close: %v", err)
	}
}

// Options.Unchecked skips the checksums (a KL reference reloaded each step,
// checked at its first load), not the checks before allocation.
func TestLoadUnchecked(t *testing.T) {
	dir, _ := savedTiny(t, false)
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil { // the same config, other bytes
		t.Fatal(err)
	}
	if _, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{})); err == nil || !strings.Contains(err.Error(), "config.json: SHA-256") {
		t.Fatalf("LoadPolicy of an edited folder: %v; want the checksum error", err)
	}
	p, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{Unchecked: true}))
	if err != nil {
		t.Fatalf("LoadPolicy unchecked: %v; want the folder loaded", err)
	}
	p.Close()
	editConfig(t, dir, func(m map[string]any) { m["num_hidden_layers"] = 1000 })
	if _, err := torchbridge.LoadPolicy(dir, onDevice(torchbridge.Options{Unchecked: true})); err == nil || !strings.Contains(err.Error(), "is missing") {
		t.Fatalf("LoadPolicy unchecked of a config claiming 1000 layers: %v; want the tensors' check", err)
	}
}

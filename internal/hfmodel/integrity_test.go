package hfmodel

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestNonFinite(t *testing.T) {
	f32 := func(v ...float32) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		return b
	}
	half := func(v ...uint16) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint16(b, x)
		}
		return b
	}
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name, dtype string
		b           []byte
		want        int64
	}{
		{"finite F32", "F32", f32(0, -1, math.MaxFloat32, math.SmallestNonzeroFloat32), -1},
		{"NaN F32", "F32", f32(1, 2, nan), 2},
		{"-Inf F32", "F32", f32(float32(math.Inf(-1))), 0},
		{"finite BF16", "BF16", half(0x3f80, 0xff7f), -1}, // 1, -max
		{"Inf BF16", "BF16", half(0x3f80, 0x7f80), 1},
		{"NaN BF16", "BF16", half(0xffc1), 0},
		{"finite F16", "F16", half(0x3c00, 0xfbff), -1}, // 1, -65504
		{"NaN F16", "F16", half(0x3c00, 0x3c00, 0x7e00), 2},
	} {
		if got := NonFinite(tc.dtype, tc.b); got != tc.want {
			t.Errorf("%s: NonFinite = %d, want %d (a NaN in the weights must be found, a finite value never)", tc.name, got, tc.want)
		}
	}
	// Eight bytes at a time: the first non-finite element is found at
	// every position of a word, after any finite value (the largest
	// finite exponents included).
	for _, d := range []struct {
		dtype      string
		es         int
		bad, large uint64
	}{{"F32", 4, 0x7fc00000, 0x7f7fffff}, {"BF16", 2, 0xff80, 0x7f7f}, {"F16", 2, 0x7c01, 0x7bff}} {
		for n := 1; n <= 19; n++ {
			for at := -1; at < n; at++ {
				b := make([]byte, n*d.es)
				for i := range n {
					v := d.large
					if i%3 == 1 {
						v = uint64(i)
					}
					if i == at {
						v = d.bad
					}
					for k := range d.es {
						b[i*d.es+k] = byte(v >> (8 * k))
					}
				}
				if got := NonFinite(d.dtype, b); got != int64(at) {
					t.Fatalf("%s: %d elements, non-finite at %d: NonFinite = %d", d.dtype, n, at, got)
				}
			}
		}
	}
}

// A checkpoint recal writes is checked file by file on load: a flipped
// byte, a missing file or a forged list is an error naming the file.
func TestVerifyChecksumsHostile(t *testing.T) {
	write := func(t *testing.T) string {
		t.Helper()
		dir := t.TempDir()
		for name, text := range map[string]string{"config.json": "{}", "model.safetensors": "weights"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := WriteChecksums(dir); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir := write(t)
	names, err := VerifyChecksums(dir, nil)
	if err != nil || strings.Join(names, ",") != "config.json,model.safetensors" {
		t.Fatalf("VerifyChecksums of an untouched folder: %v, %v; want both files checked", names, err)
	}
	for _, tc := range []struct {
		name string
		harm func(dir string) error
		want string
	}{
		{"a flipped byte", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "model.safetensors"), []byte("weighTs"), 0o644)
		}, "model.safetensors: SHA-256 "},
		{"a forged line", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, ChecksumFile), []byte("abc  ../../etc/passwd\n"), 0o644)
		}, ChecksumFile + ":1: want"},
		{"a listed FIFO", func(dir string) error {
			p := filepath.Join(dir, "model.safetensors")
			if err := os.Remove(p); err != nil {
				return err
			}
			return syscall.Mkfifo(p, 0o600)
		}, "model.safetensors: not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := write(t)
			if err := tc.harm(dir); err != nil {
				t.Fatal(err)
			}
			_, err := VerifyChecksums(dir, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("VerifyChecksums: %v; want an error containing %q", err, tc.want)
			}
		})
	}
	// A file removed is not checked (whoever reads it says it is missing).
	dir = write(t)
	if err := os.Remove(filepath.Join(dir, "config.json")); err != nil {
		t.Fatal(err)
	}
	if names, err := VerifyChecksums(dir, nil); err != nil || strings.Join(names, ",") != "model.safetensors" {
		t.Errorf("VerifyChecksums without config.json: %v, %v; want model.safetensors checked alone", names, err)
	}
	if _, err := VerifyChecksums(t.TempDir(), nil); !errors.Is(err, ErrNoChecksums) {
		t.Fatalf("VerifyChecksums of a folder without %s: %v; want ErrNoChecksums", ChecksumFile, err)
	}
}

// Mismatches finds what a hostile config.json claims beyond the weights
// before anything is allocated for it.
func TestMismatches(t *testing.T) {
	c, err := Preset("tiny", 64)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.safetensors")
	var specs []TensorSpec
	for _, p := range c.Params() {
		specs = append(specs, TensorSpec{Name: p.Name, DType: "BF16", Shape: p.Shape})
	}
	if err := WriteSafetensors(path, specs, nil, func(int, []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWeightsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if m := w.Mismatches(c); len(m) != 0 {
		t.Fatalf("Mismatches of matching weights: %v; want none", m)
	}
	big := *c
	big.NumHiddenLayers = 1000
	big.HiddenSize = 4096
	m := big.Params()
	got := w.Mismatches(&big)
	if len(got) != len(m) || !strings.Contains(got[0], `tensor "model.embed_tokens.weight": shape [64 128], want [64 4096]`) {
		t.Fatalf("Mismatches of a config claiming 1000 layers of hidden 4096: %d problems, first %q; want %d, the first naming the embedding's shape", len(got), got[0], len(m))
	}
}

// A checkpoint file that is not a regular file (a FIFO no one writes, a
// link to an endless device) is refused at once, naming it: the loader
// never waits on it or reads it without end.
func TestHostileCheckpointFiles(t *testing.T) {
	c, err := Preset("tiny", 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, kind string }{
		{"config.json", "fifo"}, {"config.json", "urandom"}, {"generation_config.json", "fifo"},
		{"model.safetensors", "fifo"}, {"model.safetensors", "urandom"}, {"model.safetensors.index.json", "fifo"},
	} {
		t.Run(tc.file+" "+tc.kind, func(t *testing.T) {
			dir := t.TempDir()
			b, _ := c.MarshalJSON()
			os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
			os.WriteFile(filepath.Join(dir, "model.safetensors"), nil, 0o644)
			path := filepath.Join(dir, tc.file)
			os.Remove(path)
			if tc.kind == "fifo" {
				if err := syscall.Mkfifo(path, 0o600); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Symlink("/dev/urandom", path); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				cfg, err := LoadConfig(dir)
				if err == nil {
					_, err = EOS(dir, cfg)
				}
				if err == nil {
					var w *Weights
					if w, err = OpenWeights(dir); err == nil {
						w.Close()
					}
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
					t.Fatalf("loading with %s as a %s: %v; want an error naming it as not a regular file", tc.file, tc.kind, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("loading with %s as a %s: still blocked after 5 s", tc.file, tc.kind)
			}
		})
	}
}

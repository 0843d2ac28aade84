package config

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// FuzzParse parses arbitrary TOML with arbitrary --set overrides (one per
// line of sets). No input may panic; every error carries the package
// prefix; a configuration Parse accepts holds no NaN or infinity, and it
// survives Write's encoding and a second Parse unchanged (a run saves its
// resolved configuration and resumes from it).
func FuzzParse(f *testing.F) {
	f.Add(base, "")
	f.Add(base, "train.lr=3e-5\npolicy.dtype=bfloat16")
	f.Add(base+"\n[train]\nstepz = 3\n", "")
	f.Add(base, "policy.nope=1")
	f.Add(base, "policy.checkpoint.x=1")
	f.Add(base, "=")
	f.Add(base+"\n[train]\nlr = nan\n", "")
	f.Add(base, "train.top_p=inf")
	f.Add(base, "calibration.tau_max=-inf")
	f.Add("[[pool.models]]\nname = 1\n", "")
	f.Add("a = [1, 'x', {b = 2}]\n", "")
	f.Add("\xff = 1\n", "")
	f.Add(base+"\n[train]\nlr = \"fast\"\n", "")
	f.Add(base, "train.lr=NaN\ntrain.steps=1e30")
	f.Add(base, "train.steps=99999999999999999999")
	f.Add(base, "serve.allowed_origins=[\"https://a.example/x\"]")
	f.Add(base, "train.stepz.x=1\ntrain.stepz=2")
	shipped, _ := filepath.Glob("../configs/*.toml")
	for _, p := range append(shipped, "../recal.toml") {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b), "")
	}
	f.Fuzz(func(t *testing.T, text, sets string) {
		var setList []string
		if sets != "" {
			setList = strings.Split(sets, "\n")
		}
		cfg, err := Parse("fuzz.toml", []byte(text), setList)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config: ") {
				t.Fatalf("error %q lacks the config: prefix", err)
			}
			return
		}
		if key, ok := nonFinite(reflect.ValueOf(cfg), ""); ok {
			t.Fatalf("Parse accepted a non-finite value at %s; want an error naming the key (text %q, sets %q)", key, text, sets)
		}
		var buf bytes.Buffer
		if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
			t.Fatalf("Write's encoding of an accepted configuration failed: %v", err)
		}
		again, err := Parse("written.toml", buf.Bytes(), nil)
		if err != nil {
			t.Fatalf("Parse of the written configuration: %v\n%s", err, buf.Bytes())
		}
		diff, err := Diff(cfg, again)
		if err != nil || len(diff) > 0 {
			t.Fatalf("the written configuration parses back different at %v (%v)\n%s", diff, err, buf.Bytes())
		}
	})
}

// nonFinite finds a NaN or infinite float in v and returns its path.
func nonFinite(v reflect.Value, path string) (string, bool) {
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		if math.IsNaN(v.Float()) || math.IsInf(v.Float(), 0) {
			return path, true
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return nonFinite(v.Elem(), path)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				if p, ok := nonFinite(v.Field(i), path+"."+v.Type().Field(i).Name); ok {
					return p, true
				}
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if p, ok := nonFinite(v.Index(i), path+"[]"); ok {
				return p, true
			}
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			if p, ok := nonFinite(v.MapIndex(k), path+"."+k.String()); ok {
				return p, true
			}
		}
	}
	return "", false
}

package hfmodel

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/inputfile"
)

// DTypeSize is the element size in bytes of each safetensors dtype recal reads.
var DTypeSize = map[string]int64{"F32": 4, "BF16": 2, "F16": 2}

// Tensor describes one tensor of a safetensors file.
type Tensor struct {
	Name  string
	DType string
	Shape []int64
	file  *os.File
	path  string
	begin int64 // absolute byte offset in the file
	size  int64
}

// Path is the file the tensor is stored in.
func (t *Tensor) Path() string { return t.path }

// Numel is the element count.
func (t *Tensor) Numel() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Weights is an open set of safetensors files of one checkpoint.
type Weights struct {
	files   []*os.File
	tensors map[string]*Tensor
	meta    map[string]string
}

// maxHeader bounds the JSON header we are willing to parse (100 MiB).
const maxHeader = 100 << 20

// OpenWeights opens dir/model.safetensors, or the shards that
// dir/model.safetensors.index.json lists.
func OpenWeights(dir string) (*Weights, error) {
	w := &Weights{tensors: map[string]*Tensor{}}
	index := filepath.Join(dir, "model.safetensors.index.json")
	var files []string
	if b, err := inputfile.ReadFile(index, inputfile.ConfigLimit); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil {
			return nil, fmt.Errorf("hfmodel: %s: %w", index, err)
		}
		if len(idx.WeightMap) == 0 {
			return nil, fmt.Errorf("hfmodel: %s: field \"weight_map\" is missing or empty", index)
		}
		seen := map[string]bool{}
		for _, f := range idx.WeightMap {
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
		sort.Strings(files)
	} else if errors.Is(err, os.ErrNotExist) {
		files = []string{"model.safetensors"}
	} else {
		return nil, fmt.Errorf("hfmodel: %w", err)
	}
	for _, f := range files {
		if filepath.Base(f) != f {
			w.Close()
			return nil, fmt.Errorf("hfmodel: %s: shard name %q must be a plain file name", index, f)
		}
		if err := w.open(filepath.Join(dir, f)); err != nil {
			w.Close()
			return nil, err
		}
	}
	return w, nil
}

func (w *Weights) open(path string) error {
	f, err := inputfile.Open(path)
	if err != nil {
		return fmt.Errorf("hfmodel: %w", err)
	}
	w.files = append(w.files, f)
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("hfmodel: %w", err)
	}
	var hdr [8]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return fmt.Errorf("hfmodel: %s: truncated header (%d bytes in file)", path, st.Size())
	}
	n := int64(binary.LittleEndian.Uint64(hdr[:]))
	if n <= 0 || n > maxHeader || 8+n > st.Size() {
		return fmt.Errorf("hfmodel: %s: corrupt or truncated: header length %d, file size %d", path, n, st.Size())
	}
	hb := make([]byte, n)
	if _, err := io.ReadFull(f, hb); err != nil {
		return fmt.Errorf("hfmodel: %s: reading header: %w", path, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hb, &raw); err != nil {
		return fmt.Errorf("hfmodel: %s: corrupt header: %w", path, err)
	}
	dataSize := st.Size() - 8 - n
	var mine []*Tensor // this file's tensors
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &w.meta); err != nil {
				return fmt.Errorf("hfmodel: %s: corrupt __metadata__: %w", path, err)
			}
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return fmt.Errorf("hfmodel: %s: tensor %q: corrupt header entry: %w", path, name, err)
		}
		if len(e.Offsets) != 2 || e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] {
			return fmt.Errorf("hfmodel: %s: tensor %q: bad data_offsets %v", path, name, e.Offsets)
		}
		if e.Offsets[1] > dataSize {
			return fmt.Errorf("hfmodel: %s: truncated: tensor %q ends at byte %d of the data, which has %d bytes", path, name, e.Offsets[1], dataSize)
		}
		t := &Tensor{Name: name, DType: e.DType, Shape: e.Shape, file: f, path: path, begin: 8 + n + e.Offsets[0], size: e.Offsets[1] - e.Offsets[0]}
		numel := int64(1)
		for _, d := range e.Shape {
			if d < 0 {
				return fmt.Errorf("hfmodel: %s: tensor %q: negative dimension in shape %v", path, name, e.Shape)
			}
			// A product past int64 would wrap, and a huge shape could
			// then claim a few bytes of data.
			if d > 0 && numel > math.MaxInt64/d {
				return fmt.Errorf("hfmodel: %s: tensor %q: shape %v has more than %d elements", path, name, e.Shape, int64(math.MaxInt64))
			}
			numel *= d
		}
		if es, ok := DTypeSize[e.DType]; ok && (numel > t.size/es || numel*es != t.size) {
			want := fmt.Sprintf("%d", numel*es)
			if numel > math.MaxInt64/es {
				want = "more than fits in int64"
			}
			return fmt.Errorf("hfmodel: %s: tensor %q: %d bytes for shape %v of %s, want %s", path, name, t.size, e.Shape, e.DType, want)
		}
		if _, dup := w.tensors[name]; dup {
			return fmt.Errorf("hfmodel: %s: tensor %q appears in two shards", path, name)
		}
		w.tensors[name] = t
		mine = append(mine, t)
	}
	return tile(path, mine, 8+n, dataSize)
}

// tile checks that a file's tensors cover its data section exactly, end to
// end, as the format requires: two tensors sharing bytes (a write to one
// would change the other) or bytes that belong to no tensor (a gap) mean a
// corrupt or forged header.
func tile(path string, ts []*Tensor, start, dataSize int64) error {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].begin != ts[j].begin {
			return ts[i].begin < ts[j].begin
		}
		return ts[i].size < ts[j].size
	})
	at := start // where the next tensor must begin
	for i, t := range ts {
		switch {
		case t.begin < at:
			return fmt.Errorf("hfmodel: %s: tensor %q (data bytes %d to %d) overlaps tensor %q", path, t.Name, t.begin-start, t.begin-start+t.size, ts[i-1].Name)
		case t.begin > at:
			return fmt.Errorf("hfmodel: %s: data bytes %d to %d, before tensor %q, belong to no tensor", path, at-start, t.begin-start, t.Name)
		}
		at = t.begin + t.size
	}
	if at-start != dataSize {
		return fmt.Errorf("hfmodel: %s: data bytes %d to %d, at the end, belong to no tensor", path, at-start, dataSize)
	}
	return nil
}

// OpenWeightsFile opens one safetensors file.
func OpenWeightsFile(path string) (*Weights, error) {
	w := &Weights{tensors: map[string]*Tensor{}}
	if err := w.open(path); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// Metadata is the __metadata__ map of the (last) file opened.
func (w *Weights) Metadata() map[string]string { return w.meta }

// Lookup returns the tensor called name.
func (w *Weights) Lookup(name string) (*Tensor, bool) {
	t, ok := w.tensors[name]
	return t, ok
}

// Mismatches lists, in the order of c.Params, every tensor a policy of c
// needs that the weights lack or hold with another shape or an unsupported
// dtype, each problem a line naming the tensor and its file. Loaders call it
// before allocating anything: the shapes a config.json claims are then
// backed by bytes in the files, so a hostile config.json cannot make a
// policy larger than its weights.
func (w *Weights) Mismatches(c *Config) []string {
	var out []string
	for _, want := range c.Params() {
		t, ok := w.tensors[want.Name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("tensor %q is missing from the weights", want.Name))
		case DTypeSize[t.DType] == 0:
			out = append(out, fmt.Sprintf("%s: tensor %q: unsupported dtype %q (want F32, BF16 or F16)", t.path, want.Name, t.DType))
		case !slices.Equal(t.Shape, want.Shape):
			out = append(out, fmt.Sprintf("%s: tensor %q: shape %v, want %v (config.json's)", t.path, want.Name, t.Shape, want.Shape))
		}
	}
	return out
}

// Names lists the tensors, sorted.
func (w *Weights) Names() []string {
	out := make([]string, 0, len(w.tensors))
	for n := range w.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Read returns a tensor's raw little-endian bytes. Its dtype must be one of
// DTypeSize's.
func (w *Weights) Read(t *Tensor) ([]byte, error) {
	if _, ok := DTypeSize[t.DType]; !ok {
		return nil, fmt.Errorf("hfmodel: %s: tensor %q: unsupported dtype %q (want F32, BF16 or F16)", t.path, t.Name, t.DType)
	}
	buf := make([]byte, t.size)
	if err := w.ReadAt(t, buf, 0); err != nil {
		return nil, err
	}
	return buf, nil
}

// ReadAt fills buf with the tensor's bytes from byte off of its data on.
func (w *Weights) ReadAt(t *Tensor, buf []byte, off int64) error {
	if off < 0 || int64(len(buf)) > t.size-off {
		return fmt.Errorf("hfmodel: %s: tensor %q: %d bytes at %d are outside its %d", t.path, t.Name, len(buf), off, t.size)
	}
	if _, err := t.file.ReadAt(buf, t.begin+off); err != nil {
		return fmt.Errorf("hfmodel: %s: tensor %q: %w", t.path, t.Name, err)
	}
	return nil
}

// Close closes the files. Safe to call twice.
func (w *Weights) Close() error {
	var first error
	for _, f := range w.files {
		if err := f.Close(); err != nil && first == nil && !errors.Is(err, os.ErrClosed) {
			first = err
		}
	}
	w.files = nil
	return first
}

// TensorSpec describes a tensor to write.
type TensorSpec struct {
	Name  string
	DType string
	Shape []int64
}

func (s TensorSpec) bytes() int64 {
	n := DTypeSize[s.DType]
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// WriteSafetensors writes a safetensors file at path, atomically (a temporary
// file in the same folder, fsync, rename). fill is called once per tensor, in
// order, with a buffer of exactly the tensor's size to fill.
func WriteSafetensors(path string, specs []TensorSpec, meta map[string]string, fill func(i int, buf []byte) error) error {
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	var off int64
	for _, s := range specs {
		if _, ok := DTypeSize[s.DType]; !ok {
			return fmt.Errorf("hfmodel: %s: tensor %q: unsupported dtype %q", path, s.Name, s.DType)
		}
		shape := s.Shape
		if shape == nil {
			shape = []int64{}
		}
		header[s.Name] = map[string]any{"dtype": s.DType, "shape": shape, "data_offsets": []int64{off, off + s.bytes()}}
		off += s.bytes()
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("hfmodel: %s: %w", path, err)
	}
	for len(hb)%8 != 0 { // the format pads the header with spaces to 8 bytes
		hb = append(hb, ' ')
	}
	return atomicfile.Write(path, func(wr io.Writer) error {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(hb)))
		if _, err := wr.Write(n[:]); err != nil {
			return err
		}
		if _, err := wr.Write(hb); err != nil {
			return err
		}
		for i, s := range specs {
			buf := make([]byte, s.bytes())
			if err := fill(i, buf); err != nil {
				return fmt.Errorf("tensor %q: %w", s.Name, err)
			}
			if _, err := wr.Write(buf); err != nil {
				return err
			}
		}
		return nil
	})
}

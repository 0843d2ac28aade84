package hfmodel

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/inputfile"
)

// NonFinite returns the index of the first NaN or infinite element of raw
// little-endian data of dtype ("F32", "BF16", "F16"), or -1 when every
// element is finite (and for another dtype). Loading a checkpoint checks
// every tensor with it: a NaN in the weights gives no error of its own,
// only a policy that writes "!!!!!!!!".
func NonFinite(dtype string, b []byte) int64 {
	// An element is non-finite when its exponent bits are all set. Eight
	// bytes at a time: a lane of y is zero exactly for such an element, and
	// (y - ones) &^ y & highs is non-zero exactly when some lane is (the
	// lanes' top bits are clear in y); only such words are looked at
	// element by element.
	var es int
	var exp, ones, highs uint64
	switch dtype {
	case "F32":
		es, exp, ones, highs = 4, 0x7f800000_7f800000, 0x00000001_00000001, 0x80000000_80000000
	case "BF16":
		es, exp, ones, highs = 2, 0x7f80_7f80_7f80_7f80, 0x0001_0001_0001_0001, 0x8000_8000_8000_8000
	case "F16":
		es, exp, ones, highs = 2, 0x7c00_7c00_7c00_7c00, 0x0001_0001_0001_0001, 0x8000_8000_8000_8000
	default:
		return -1
	}
	i := 0
	for ; i+8 <= len(b); i += 8 {
		y := binary.LittleEndian.Uint64(b[i:])&exp ^ exp
		if (y-ones)&^y&highs != 0 {
			break
		}
	}
	lane := exp & (1<<(8*es) - 1)
	for ; i+es <= len(b); i += es {
		var v uint64
		if es == 4 {
			v = uint64(binary.LittleEndian.Uint32(b[i:]))
		} else {
			v = uint64(binary.LittleEndian.Uint16(b[i:]))
		}
		if v&lane == lane {
			return int64(i / es)
		}
	}
	return -1
}

// ChecksumFile lists the SHA-256 of every other file of a checkpoint folder
// recal writes, in the format of sha256sum (so `sha256sum -c` checks it
// too). A Hugging Face folder from elsewhere has none.
const ChecksumFile = "checksums.sha256"

// PolicyFile reports whether loading a checkpoint's policy reads its file
// name: every file but the optimizer's and the trainer's state, which their
// own loaders check.
func PolicyFile(name string) bool {
	return name != "optimizer.safetensors" && name != "trainer_state.json"
}

// ErrNoChecksums is returned by VerifyChecksums for a folder without
// ChecksumFile.
var ErrNoChecksums = errors.New("hfmodel: no " + ChecksumFile + " (a checkpoint from elsewhere; its files cannot be checked for corruption)")

// WriteChecksums writes dir/ChecksumFile with the SHA-256 of each regular
// file in dir (hidden temporary files and ChecksumFile itself excepted),
// atomically.
func WriteChecksums(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("hfmodel: %w", err)
	}
	var out bytes.Buffer
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || name == ChecksumFile || strings.HasPrefix(name, ".") {
			continue
		}
		sum, err := fileSHA256(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		fmt.Fprintf(&out, "%s  %s\n", sum, name)
	}
	return atomicfile.Write(filepath.Join(dir, ChecksumFile), func(w io.Writer) error {
		_, err := w.Write(out.Bytes())
		return err
	})
}

// VerifyChecksums checks the files dir/ChecksumFile lists (those for which
// want is true; every one when want is nil) against their SHA-256 and
// returns the names checked. A listed file that differs, or is not a
// regular file, is an error naming it; one that is gone is skipped (its
// reader says it is missing, where it is needed: a tokenizer file removed
// on purpose is no corruption); a folder without ChecksumFile gives
// ErrNoChecksums.
func VerifyChecksums(dir string, want func(name string) bool) ([]string, error) {
	path := filepath.Join(dir, ChecksumFile)
	b, err := inputfile.ReadFile(path, inputfile.ConfigLimit)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoChecksums
	}
	if err != nil {
		return nil, fmt.Errorf("hfmodel: %w", err)
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 || name == "" || filepath.Base(name) != name || slices.Contains(names, name) {
			return names, fmt.Errorf("hfmodel: %s:%d: want \"<64 hex digits>  <file name>\" naming a file of the folder once", path, n)
		}
		if _, err := hex.DecodeString(sum); err != nil {
			return names, fmt.Errorf("hfmodel: %s:%d: checksum %q is not hexadecimal", path, n, sum)
		}
		if want != nil && !want(name) {
			continue
		}
		got, err := fileSHA256(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return names, fmt.Errorf("%w (listed in %s)", err, path)
		}
		if got != strings.ToLower(sum) {
			return names, fmt.Errorf("hfmodel: %s: SHA-256 %s, but %s:%d says %s: the file is corrupt or was edited since recal wrote it (remove %s to load the folder unchecked)",
				filepath.Join(dir, name), got, path, n, sum, ChecksumFile)
		}
		names = append(names, name)
	}
	return names, nil
}

func fileSHA256(path string) (string, error) {
	f, err := inputfile.Open(path)
	if err != nil {
		return "", fmt.Errorf("hfmodel: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hfmodel: %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// CheckFinite reads tensor t in pieces of at most ReadChunk bytes and
// returns an error naming it and the first element that is NaN or infinite.
func (w *Weights) CheckFinite(t *Tensor) error {
	es := DTypeSize[t.DType]
	if es == 0 {
		return nil
	}
	buf := make([]byte, min(t.size, ReadChunk)/es*es)
	for off := int64(0); off < t.size; off += int64(len(buf)) {
		b := buf[:min(int64(len(buf)), t.size-off)]
		if err := w.ReadAt(t, b, off); err != nil {
			return err
		}
		if i := NonFinite(t.DType, b); i >= 0 {
			return NonFiniteError(t, off/es+i)
		}
	}
	return nil
}

// NonFiniteError is the error for element i of tensor t being NaN or
// infinite.
func NonFiniteError(t *Tensor, i int64) error {
	return fmt.Errorf("hfmodel: %s: tensor %q: element %d is NaN or infinite: the weights are corrupt", t.path, t.Name, i)
}

// Package inputfile opens and reads the files recal takes from its user
// (configurations, a checkpoint's config.json, tokenizer and weight files,
// outcome logs, question files) so that a hostile one cannot hang or exhaust
// the process: only regular files are read (a FIFO, a device such as
// /dev/urandom or a socket is refused at once, without blocking in open),
// and a file read whole must fit a size limit, checked before the read and
// enforced during it.
package inputfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Size limits of the files recal reads whole. A file past its limit is
// refused naming the file, its size and the limit.
const (
	// ConfigLimit bounds a TOML configuration and a checkpoint's small JSON
	// files (config.json, generation_config.json, the shard index).
	ConfigLimit = 16 << 20
	// TextLimit bounds a tokenizer's files, question files and pool
	// definitions read whole.
	TextLimit = 1 << 30
)

// ErrNotRegular is returned for a path that is not a regular file (after
// symbolic links are followed).
var ErrNotRegular = errors.New("not a regular file")

// Open opens path for reading when it is a regular file. The open does not
// block on a FIFO (O_NONBLOCK, which a regular file's reads ignore), and the
// opened file is checked, not just the path, so a file swapped in between
// cannot slip through.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w (%s); recal reads inputs from regular files only", ErrNotRegular, kind(st.Mode()))}
	}
	return f, nil
}

// ReadFile reads the regular file path whole when it has at most limit
// bytes.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > limit {
		return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("%d bytes, more than the limit of %d", st.Size(), limit)}
	}
	// The file may grow while it is read: read one byte past the limit to
	// see it.
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("more than the limit of %d bytes", limit)}
	}
	return b, nil
}

func kind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return "mode " + m.String()
}

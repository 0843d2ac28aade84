// Package runlock keeps two processes from working in one folder at once:
// a second `recal train --resume` or `recal ablate` on a folder in use
// would interleave its writes with the first's (logs, checkpoints, the
// links last and best).
//
// The lock is an exclusive flock(2) on FOLDER/.lock, which names its holder
// (pid, host, command). The kernel drops a flock when its process ends,
// however it ends, so the lock of a process that died is stale and simply
// taken over; the file it left is overwritten. A clean Release removes the
// file. On a filesystem shared by several hosts (NFS) Linux maps flock to
// the server's POSIX locks.
package runlock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// File is the lock's name inside the folder.
const File = ".lock"

// Holder is what the lock file says of the process that holds it.
type Holder struct {
	PID     int    `json:"pid"`
	Host    string `json:"host"`
	Command string `json:"command"` // what it is doing, e.g. "recal train"
	Since   string `json:"since"`   // RFC 3339
}

// HeldError is a folder locked by another process.
type HeldError struct {
	Dir    string
	Holder Holder // zero when the holder had not written its name yet
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.Holder.PID > 0 {
		who = fmt.Sprintf("pid %d", e.Holder.PID)
		if e.Holder.Host != "" {
			who += " on " + e.Holder.Host
		}
		if e.Holder.Command != "" {
			who += " (" + e.Holder.Command
			if e.Holder.Since != "" {
				who += ", since " + e.Holder.Since
			}
			who += ")"
		}
	}
	return fmt.Sprintf("runlock: %s is in use by %s: wait for it to end or stop it (a second process would interleave its writes with the first's)",
		e.Dir, who)
}

// Lock is a held lock; see Acquire.
type Lock struct {
	f       *os.File
	dir     string
	created []string // the folders Acquire made, deepest first
}

// Acquire locks dir (created if missing) for command, this process's
// description in the holder's file. It fails at once with a *HeldError when
// a live process holds the lock.
func Acquire(dir, command string) (*Lock, error) {
	var created []string // the folders MkdirAll makes, deepest first
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			break
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		// A symbolic link to nothing reads as "file exists": say what it is.
		if target, lerr := os.Readlink(filepath.Clean(dir)); lerr == nil {
			if _, serr := os.Stat(dir); errors.Is(serr, os.ErrNotExist) {
				return nil, fmt.Errorf("runlock: %s is a symbolic link to %s, which does not exist: create the target or remove the link", dir, target)
			}
		}
		return nil, fmt.Errorf("runlock: %w", err)
	}
	path := filepath.Join(dir, File)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("runlock: %w", err)
		}
		if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			var h Holder
			if b, rerr := os.ReadFile(path); rerr == nil {
				json.Unmarshal(b, &h) // a holder that has not written yet reads as unknown
			}
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, &HeldError{Dir: dir, Holder: h}
			}
			return nil, fmt.Errorf("runlock: lock %s: %w", path, err)
		}
		// A holder releasing the lock removes the file: if it did so
		// between our open and our flock, we hold a lock on a file no
		// longer there, which the next process would not see. Start over.
		if same, err := samePath(f, path); err != nil {
			f.Close()
			return nil, fmt.Errorf("runlock: %w", err)
		} else if !same {
			f.Close()
			continue
		}
		host, _ := os.Hostname()
		b, _ := json.Marshal(Holder{PID: os.Getpid(), Host: host, Command: command, Since: time.Now().Format(time.RFC3339)})
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt(append(b, '\n'), 0)
		}
		if err != nil {
			os.Remove(path)
			f.Close()
			return nil, fmt.Errorf("runlock: write %s: %w", path, err)
		}
		return &Lock{f: f, dir: dir, created: created}, nil
	}
}

// Release removes the lock file and drops the lock; the folders Acquire
// made are removed again when nothing else was written in them. Safe to
// call twice and on nil.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := os.Remove(filepath.Join(l.dir, File)) // while held: see Acquire
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	for _, d := range l.created {
		if os.Remove(d) != nil { // fails, as it should, unless empty
			break
		}
	}
	if err != nil {
		return fmt.Errorf("runlock: release %s: %w", l.dir, err)
	}
	return nil
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// samePath reports whether the open file f is still the file at path.
func samePath(f *os.File, path string) (bool, error) {
	a, err := f.Stat()
	if err != nil {
		return false, err
	}
	b, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(a, b), nil
}

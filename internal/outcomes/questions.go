package outcomes

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/recal-project/recal/internal/inputfile"
)

// question is one row of a question file, as package data reads it.
type question struct {
	ID       string   `json:"id"`
	Question string   `json:"question"`
	Golden   []string `json:"golden_answers"`
	Dataset  string   `json:"dataset"`
}

// writeQuestions writes a question file of package data (JSON Lines with
// id, question, golden_answers and dataset) at path, creating its folder.
func writeQuestions(path string, qs []question) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("outcomes: %w", err)
	}
	return writeFile(path, func(w io.Writer) error {
		bw := bufio.NewWriter(w)
		enc := json.NewEncoder(bw)
		enc.SetEscapeHTML(false)
		for i := range qs {
			if err := enc.Encode(&qs[i]); err != nil {
				return err
			}
		}
		return bw.Flush()
	})
}

// writeFile writes path through a temporary file renamed into place, so a
// reader never sees half a file.
func writeFile(path string, fill func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("outcomes: %w", err)
	}
	if err := fill(tmp); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("outcomes: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("outcomes: write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("outcomes: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("outcomes: %w", err)
	}
	return nil
}

// copyFile copies src to dst.
func copyFile(src, dst string) error {
	in, err := inputfile.Open(src)
	if err != nil {
		return fmt.Errorf("outcomes: %w", err)
	}
	defer in.Close()
	return writeFile(dst, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

package plot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
)

// readJSONL decodes every non-blank line of the file at path into a T, in
// file order. A line that does not decode is a *LineError unless it is the
// last non-blank line, which a writer killed mid-line leaves truncated; that
// one is logged at Warn and skipped. Unknown JSON fields are ignored.
//
// The whole file is read at once: a metrics file holds one short line per
// step, a few megabytes for the longest runs.
func readJSONL[T any](path string, log *slog.Logger) ([]T, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("plot: %w", err)
	}
	lines := bytes.Split(raw, []byte("\n"))
	last := len(lines) - 1
	for last >= 0 && len(bytes.TrimSpace(lines[last])) == 0 {
		last--
	}
	var out []T
	for i := 0; i <= last; i++ {
		line := bytes.TrimSpace(lines[i])
		if len(line) == 0 {
			continue
		}
		var rec T
		if err := json.Unmarshal(line, &rec); err != nil {
			if i == last {
				log.Warn("plot: skipped truncated last line", slog.String("file", path),
					slog.Int("line", i+1), slog.String("err", err.Error()))
				break
			}
			return nil, &LineError{Path: path, Line: i + 1, Err: err}
		}
		out = append(out, rec)
	}
	return out, nil
}

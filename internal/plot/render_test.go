package plot

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"image/png"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run describes a synthetic run folder.
type run struct {
	steps      int  // metrics lines
	validation bool // write validation.jsonl, one record every 10 steps
	noKL       bool // leave "kl" out of every line
}

// write creates the run's files in dir. The lines vary the way a real run's
// do: a model joins the pool at step 20, every 7th line lacks
// calls_per_question, every line carries fields the package does not know.
func (r run) write(t *testing.T, dir string) {
	t.Helper()
	var m bytes.Buffer
	for s := 1; s <= r.steps; s++ {
		x := float64(s) / float64(r.steps)
		wiggle := 0.1 * math.Sin(float64(s)*1.7)
		share := map[string]float64{"sim-large": 0.6 - 0.3*x, "sim-small": 0.4 + 0.3*x}
		if s >= 20 {
			share = map[string]float64{"sim-large": 0.4 - 0.2*x, "sim-small": 0.4 + 0.1*x, "sim-multihop": 0.2 + 0.1*x}
		}
		line := map[string]any{
			"step": s,
			"reward": map[string]float64{
				"ans": 0.2 + 0.4*x + wiggle, "info": 0.1 + 0.2*x, "format": 0.7 + 0.25*x + wiggle/2,
				"route": 0.5 + 0.3*x, "balance": 0.4 + 0.1*x - wiggle,
			},
			"em": 0.3 * x, "f1": 0.4 * x, "model_share": share,
			"entropy": 2.0 - x + wiggle, "clip_frac": 0.01, "loss": 0.02, "step_time_s": 4.2,
			"some_future_field": []int{1, 2},
		}
		if s%7 != 0 {
			line["calls_per_question"] = 2.5 - 1.2*x + wiggle
		}
		if !r.noKL {
			line["kl"] = 0.001 * float64(s)
		}
		writeJSONLine(t, &m, line)
	}
	writeFile(t, filepath.Join(dir, MetricsFile), m.String())

	if !r.validation {
		return
	}
	var v bytes.Buffer
	for s := 10; s <= r.steps; s += 10 {
		x := float64(s) / float64(r.steps)
		ds := map[string]any{
			"nq":       map[string]any{"em": 0.2 + 0.2*x, "f1": 0.3 + 0.2*x, "n": 32},
			"hotpotqa": map[string]any{"em": 0.1 + 0.2*x, "f1": 0.2 + 0.25*x, "n": 32},
		}
		if s >= 30 {
			ds["2wiki"] = map[string]any{"em": 0.15, "f1": 0.25 + 0.1*x, "n": 32}
		}
		writeJSONLine(t, &v, map[string]any{"step": s, "datasets": ds, "avg": map[string]any{"em": 0.2, "f1": 0.25 + 0.2*x}})
	}
	writeFile(t, filepath.Join(dir, ValidationFile), v.String())
}

func writeJSONLine(t *testing.T, w io.Writer, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(w, "%s\n", b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// quiet returns options whose warnings go to the returned buffer.
func quiet() (Options, *bytes.Buffer) {
	var buf bytes.Buffer
	return Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))}, &buf
}

func names(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Base(p)
	}
	return out
}

// checkFiles checks that every path is a real figure: PNGs decode to
// PNGWidth×PNGHeight, SVGs are well-formed XML with an <svg> root, and
// neither is near-empty (a blank canvas would pass the format checks).
func checkFiles(t *testing.T, paths []string) {
	t.Helper()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("Render returned %s but it cannot be read: %v", p, err)
			continue
		}
		switch filepath.Ext(p) {
		case ".png":
			if len(b) < 10_000 {
				t.Errorf("%s is %d bytes, want ≥ 10000: a figure with axes, text and lines is larger", p, len(b))
			}
			img, err := png.Decode(bytes.NewReader(b))
			if err != nil {
				t.Errorf("%s does not decode as PNG: %v", p, err)
				continue
			}
			if got := img.Bounds().Size(); got.X != PNGWidth || got.Y != PNGHeight {
				t.Errorf("%s is %dx%d pixels, want %dx%d (PNGWidth×PNGHeight)", p, got.X, got.Y, PNGWidth, PNGHeight)
			}
		case ".svg":
			if len(b) < 5_000 {
				t.Errorf("%s is %d bytes, want ≥ 5000: a figure with axes, text and lines is larger", p, len(b))
			}
			if err := checkXML(b); err != nil {
				t.Errorf("%s is not a well-formed SVG document: %v", p, err)
			}
		default:
			t.Errorf("Render returned %s, want only .png and .svg files", p)
		}
	}
}

// checkXML parses b to the end and checks that its root element is <svg>.
func checkXML(b []byte) error {
	d := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		return fmt.Errorf("root element <%s>, want <svg>", root)
	}
	return nil
}

func TestRender(t *testing.T) {
	tests := []struct {
		name string
		run  run
		want []string
	}{
		{
			name: "with validation",
			run:  run{steps: 60, validation: true},
			want: []string{"rewards.png", "rewards.svg", "calls.png", "calls.svg", "model_share.png", "model_share.svg",
				"entropy.png", "entropy.svg", "kl.png", "kl.svg", "validation_f1.png", "validation_f1.svg"},
		},
		{
			name: "no validation.jsonl, no kl field",
			run:  run{steps: 60, noKL: true},
			want: []string{"rewards.png", "rewards.svg", "calls.png", "calls.svg", "model_share.png", "model_share.svg",
				"entropy.png", "entropy.svg"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runDir := t.TempDir()
			tt.run.write(t, runDir)
			outDir := filepath.Join(t.TempDir(), "plots", "nested") // must be created
			opts, _ := quiet()
			paths, err := opts.Render(runDir, outDir)
			if err != nil {
				t.Fatalf("Render of a well-formed run: %v", err)
			}
			if got := strings.Join(names(paths), " "); got != strings.Join(tt.want, " ") {
				t.Errorf("Render wrote %s\nwant %s\n(one PNG and one SVG per figure that has data, in figure order)", got, strings.Join(tt.want, " "))
			}
			for _, p := range paths {
				if filepath.Dir(p) != outDir {
					t.Errorf("Render wrote %s outside outDir %s", p, outDir)
				}
			}
			checkFiles(t, paths)
			entries, err := os.ReadDir(outDir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != len(paths) {
				t.Errorf("outDir holds %d entries, want %d: temporary files must not be left behind", len(entries), len(paths))
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	good := `{"step":1,"reward":{"ans":0.1},"entropy":1.0}` + "\n"
	tests := []struct {
		name       string
		metrics    *string // nil: no metrics.jsonl
		validation string  // "" means no validation.jsonl
		opts       Options
		wantIs     error
		wantLine   int      // > 0: want a *LineError at this line
		wantInMsg  []string // substrings of the message (file names)
	}{
		{name: "missing metrics", wantIs: fs.ErrNotExist, wantInMsg: []string{MetricsFile}},
		{name: "empty metrics", metrics: ptr(""), wantIs: ErrNoRecords, wantInMsg: []string{MetricsFile}},
		{name: "blank metrics", metrics: ptr("\n  \n\n"), wantIs: ErrNoRecords, wantInMsg: []string{MetricsFile}},
		{name: "only a truncated line", metrics: ptr(`{"step":1,"rew`), wantIs: ErrNoRecords, wantInMsg: []string{MetricsFile}},
		{
			name:      "malformed middle line",
			metrics:   ptr(good + good + `{"step":3,"reward":` + "\n" + good + good),
			wantLine:  3,
			wantInMsg: []string{MetricsFile, "line 3"},
		},
		{
			name:      "wrong type in middle line",
			metrics:   ptr(good + `{"step":2,"entropy":"high"}` + "\n" + good),
			wantLine:  2,
			wantInMsg: []string{MetricsFile, "line 2"},
		},
		{
			name:       "malformed middle validation line",
			metrics:    ptr(good),
			validation: `{"step":1,"avg":{"f1":0.2}}` + "\nnot json\n" + `{"step":2,"avg":{"f1":0.3}}` + "\n",
			wantLine:   2,
			wantInMsg:  []string{ValidationFile, "line 2"},
		},
		{name: "negative window", metrics: ptr(good), opts: Options{Window: -1}, wantInMsg: []string{"window -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runDir := t.TempDir()
			if tt.metrics != nil {
				writeFile(t, filepath.Join(runDir, MetricsFile), *tt.metrics)
			}
			if tt.validation != "" {
				writeFile(t, filepath.Join(runDir, ValidationFile), tt.validation)
			}
			opts := tt.opts
			opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			paths, err := opts.Render(runDir, t.TempDir())
			if err == nil {
				t.Fatalf("Render succeeded with %v, want an error: a broken run must not give silent plots", names(paths))
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %q does not wrap %v, which callers test for", err, tt.wantIs)
			}
			if tt.wantLine > 0 {
				var le *LineError
				if !errors.As(err, &le) {
					t.Fatalf("error %q is not a *LineError, want one naming line %d", err, tt.wantLine)
				}
				if le.Line != tt.wantLine {
					t.Errorf("LineError.Line = %d, want %d: the user must find the bad line", le.Line, tt.wantLine)
				}
			}
			for _, s := range tt.wantInMsg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if !strings.HasPrefix(err.Error(), "plot: ") {
				t.Errorf("error %q lacks the package prefix \"plot: \"", err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A run killed with SIGKILL leaves half a line at the end of metrics.jsonl
// (and possibly validation.jsonl); plotting it must still work.
func TestRenderTruncatedLastLine(t *testing.T) {
	runDir := t.TempDir()
	run{steps: 30, validation: true}.write(t, runDir)
	for _, name := range []string{MetricsFile, ValidationFile} {
		f, err := os.OpenFile(filepath.Join(runDir, name), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(`{"step":31,"reward":{"ans":0.4,"inf`); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	opts, logs := quiet()
	paths, err := opts.Render(runDir, t.TempDir())
	if err != nil {
		t.Fatalf("Render with a truncated last line: %v; want the line skipped", err)
	}
	if len(paths) != 12 {
		t.Errorf("Render wrote %v, want all 12 files", names(paths))
	}
	checkFiles(t, paths[:2])
	for _, want := range []string{"truncated last line", MetricsFile, "line=31", ValidationFile, "line=4"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("warnings %q do not mention %q; the skipped line must be reported", logs, want)
		}
	}
}

// Warnings go to slog.Default when Options.Logger is nil; Render must not
// need a logger to be set.
func TestRenderDefaultLogger(t *testing.T) {
	runDir := t.TempDir()
	writeFile(t, filepath.Join(runDir, MetricsFile), `{"step":1,"entropy":1.5}`+"\n"+`{"step":2,"entropy":1.4}`+"\n"+`{"st`)
	prev := slog.Default()
	var buf bytes.Buffer
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	paths, err := Render(runDir, t.TempDir())
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	if got := strings.Join(names(paths), " "); got != "entropy.png entropy.svg" {
		t.Errorf("Render wrote %s, want only the entropy figure: the other fields are absent", got)
	}
	for _, want := range []string{"truncated last line", "figure=rewards", "figure=kl"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("default logger got %q, want a warning mentioning %q", buf.String(), want)
		}
	}
}

func ExampleRender() {
	runDir, _ := os.MkdirTemp("", "recal-run")
	defer os.RemoveAll(runDir)
	var lines string
	for s := 1; s <= 20; s++ {
		lines += fmt.Sprintf(`{"step":%d,"reward":{"ans":%.2f,"format":0.9},"calls_per_question":1.5,`+
			`"model_share":{"sim-large":0.7,"sim-small":0.3},"entropy":1.8,"kl":0.002}`+"\n", s, 0.02*float64(s))
	}
	os.WriteFile(filepath.Join(runDir, "metrics.jsonl"), []byte(lines), 0o644)

	paths, err := Render(runDir, filepath.Join(runDir, "plots"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range paths {
		fmt.Println(filepath.Base(p))
	}
	// Output:
	// rewards.png
	// rewards.svg
	// calls.png
	// calls.svg
	// model_share.png
	// model_share.svg
	// entropy.png
	// entropy.svg
	// kl.png
	// kl.svg
}

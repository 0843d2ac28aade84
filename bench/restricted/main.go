// Command restricted measures how a trained router honours a request's
// recal.models: it starts the real server (bin/recal serve) on a checkpoint,
// sends the same test questions (-per of each of -datasets, greedy) once
// unrestricted and once restricted to each single pool model in turn
// (recal.models = [that model]), over HTTP, and reports for each run the
// share of questions whose response called that model by its right name
// (a call made, not an unknown-model failure) — unrestricted: called any
// pool model — with the models the responses did call. Target: at least
// 0.95 for every single model. -extra-models adds unseen models (recal
// serve --extra-models) and measures them alone too.
//
//	go run ./bench/restricted -checkpoint runs/recal
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
)

func main() {
	bin := flag.String("recal", "bin/recal", "the recal binary")
	cfgPath := flag.String("config", "recal.toml", "configuration (its pool, router and test data)")
	ck := flag.String("checkpoint", "runs/recal", "checkpoint or training run folder to serve (a run serves checkpoints/best, else last)")
	datasets := flag.String("datasets", "nq,hotpotqa", "test datasets, comma-separated")
	per := flag.Int("per", 50, "test questions per dataset (the first of data.test's order)")
	extra := flag.String("extra-models", "", "TOML file of [[models]] added to the pool at serve time (unseen in training); each is also measured alone")
	clients := flag.Int("clients", 8, "requests in flight")
	threads := flag.Int("threads", 0, "libtorch CPU threads (0 = all cores)")
	out := flag.String("out", "", "also write the results as JSON to this file")
	flag.Parse()
	if err := run(*bin, *cfgPath, *ck, strings.Split(*datasets, ","), *per, *extra, *clients, *threads, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bench restricted:", err)
		os.Exit(1)
	}
}

// result is one restriction's measurement.
type result struct {
	Models        []string       `json:"models"`    // recal.models sent (none: unrestricted)
	Questions     int            `json:"questions"` // questions sent
	Right         int            `json:"right"`     // responses that called a model of Models (unrestricted: any pool model)
	Share         float64        `json:"share"`     // Right / Questions
	Called        map[string]int `json:"called"`    // responses that called each model (a call made)
	Unknown       map[string]int `json:"unknown"`   // responses that wrote each name it may not call (no call made), cut to 16 bytes
	NoCall        int            `json:"no_call"`   // responses without any <search>
	Errors        int            `json:"errors"`    // requests that failed
	FirstErr      string         `json:"first_error,omitempty"`
	WallSecs      float64        `json:"wall_s"`
	Checkpt       string         `json:"checkpoint"`
	FirstQuestion string         `json:"first_question"`
}

func run(bin, cfgPath, ck string, datasets []string, per int, extra string, clients, threads int, out string) error {
	cfg, err := config.Load(cfgPath, nil)
	if err != nil {
		return err
	}
	cfg.Data.Test, cfg.Data.TestPerDataset = datasets, per
	qs, err := cfg.Data.LoadTest()
	if err != nil {
		return err
	}
	var pool []string
	for _, m := range cfg.Pool.Models {
		pool = append(pool, m.Name)
	}
	if extra != "" {
		var f struct {
			Models []struct {
				Name string `toml:"name"`
			} `toml:"models"`
		}
		if _, err := toml.DecodeFile(extra, &f); err != nil {
			return fmt.Errorf("%s: %w", extra, err)
		}
		for _, m := range f.Models {
			pool = append(pool, m.Name)
		}
	}

	args := []string{"--log-level", "warn", "serve", "--config", cfgPath, "--checkpoint", ck, "--addr", "127.0.0.1:0"}
	if extra != "" {
		args = append(args, "--extra-models", extra)
	}
	if threads > 0 {
		args = append([]string{"--threads", fmt.Sprint(threads)}, args...)
	}
	srv := exec.Command(bin, args...)
	srv.Stderr = os.Stderr
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return fmt.Errorf("recal serve printed no URL: %w", err)
	}
	base := strings.TrimSpace(line)
	client := &http.Client{Timeout: 10 * time.Minute}
	var id struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := getJSON(client, base+"/models", &id); err != nil || len(id.Data) == 0 {
		return fmt.Errorf("GET /v1/models: %v", err)
	}
	router := id.Data[0].ID // the router's id comes first

	restrictions := [][]string{nil}
	for _, m := range pool {
		restrictions = append(restrictions, []string{m})
	}
	var results []result
	fmt.Printf("checkpoint %s, %d questions (%s, %d each), greedy\n\n", ck, len(qs), strings.Join(datasets, ", "), per)
	fmt.Printf("| recal.models | calls it by its right name | responses calling each model | unknown names written | no call | errors |\n")
	fmt.Printf("| --- | --- | --- | --- | --- | --- |\n")
	for _, models := range restrictions {
		r := measure(client, base, router, qs, models, pool, clients)
		r.Checkpt = ck
		results = append(results, r)
		name := "(all)"
		if models != nil {
			name = strings.Join(models, ",")
		}
		fmt.Printf("| %s | %.2f (%d/%d) | %s | %s | %d | %d |\n", name, r.Share, r.Right, r.Questions, counts(r.Called), counts(r.Unknown), r.NoCall, r.Errors)
		if r.FirstErr != "" {
			fmt.Fprintln(os.Stderr, "first error:", r.FirstErr)
		}
	}
	if out != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, append(b, '\n'), 0o644)
	}
	return nil
}

func measure(client *http.Client, base, router string, qs []data.Example, models, pool []string, clients int) result {
	r := result{Models: models, Questions: len(qs), Called: map[string]int{}, Unknown: map[string]int{}, FirstQuestion: qs[0].ID}
	allowed := map[string]bool{}
	for _, m := range models {
		allowed[strings.ToLower(m)] = true
	}
	if models == nil {
		for _, m := range pool {
			allowed[strings.ToLower(m)] = true
		}
	}
	start := time.Now()
	var mu sync.Mutex
	sem := make(chan struct{}, clients)
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			trace, err := ask(client, base, router, q.Question, models)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Errors++
				if r.FirstErr == "" {
					r.FirstErr = err.Error()
				}
				return
			}
			called, unknown := map[string]bool{}, map[string]bool{}
			right := false
			for _, e := range trace {
				switch {
				case e.Unknown:
					unknown[e.Model] = true
				case !e.Refused:
					called[e.Model] = true
					right = right || allowed[strings.ToLower(e.Model)]
				}
			}
			for m := range called {
				r.Called[m]++
			}
			for m := range unknown {
				r.Unknown[short(m)]++
			}
			if len(trace) == 0 {
				r.NoCall++
			}
			if right {
				r.Right++
			}
		}()
	}
	wg.Wait()
	r.WallSecs = time.Since(start).Seconds()
	r.Share = float64(r.Right) / float64(r.Questions)
	return r
}

type traceEntry struct {
	Model   string `json:"model"`
	Unknown bool   `json:"unknown"`
	Refused bool   `json:"refused"`
}

// ask sends one greedy chat completion and returns its recal.trace.
func ask(client *http.Client, base, router, question string, models []string) ([]traceEntry, error) {
	body := map[string]any{"model": router, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": question}}}
	if models != nil {
		body["recal"] = map[string]any{"models": models}
	}
	b, _ := json.Marshal(body)
	resp, err := client.Post(base+"/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, text)
	}
	var cr struct {
		Recal struct {
			Trace []traceEntry `json:"trace"`
		} `json:"recal"`
	}
	if err := json.Unmarshal(text, &cr); err != nil {
		return nil, err
	}
	return cr.Recal.Trace, nil
}

func getJSON(client *http.Client, url string, v any) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// short cuts a name the policy wrote to 16 bytes (a derailed copy can
// write a whole question as the model's name).
func short(s string) string {
	s = strings.Join(strings.Fields(s), " ") // one line in the table
	if len(s) <= 16 {
		return s
	}
	return strings.ToValidUTF8(s[:16], "") + "…"
}

// counts lists m's largest counts, at most 4, then how many others.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var parts []string
	rest := 0
	for i, k := range keys {
		if i < 4 {
			parts = append(parts, fmt.Sprintf("`%s` %d", k, m[k]))
		} else {
			rest += m[k]
		}
	}
	if rest > 0 {
		parts = append(parts, fmt.Sprintf("%d others", rest))
	}
	return strings.Join(parts, ", ")
}

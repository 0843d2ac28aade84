package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// serveSets are the test server's settings over recal.toml: short turns for
// the micro test policy, 2 threads.
var serveSets = []string{"--set", "router.turn_tokens=16", "--set", "router.info_tokens=8", "--set", "router.max_turns=2",
	"--set", "serve.max_batch=4", "--set", "serve.max_queue=32"}

// TestServeHelper is not a test: the serve tests run the test binary with
// RECAL_SERVE_ARGS (a JSON array) to get a `recal serve` process that
// handles signals as recal does.
func TestServeHelper(t *testing.T) {
	argv := os.Getenv("RECAL_SERVE_ARGS")
	if argv == "" {
		t.Skip("run by the serve tests")
	}
	var args []string
	if err := json.Unmarshal([]byte(argv), &args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(99)
	}
	ctx, stop := interruptContext(context.Background(), os.Stderr, os.Exit)
	defer stop()
	os.Exit(run(ctx, append([]string{"recal"}, args...)))
}

// serveProc is a `recal serve` subprocess.
type serveProc struct {
	cmd    *exec.Cmd
	url    string // http://127.0.0.1:PORT/v1
	stderr *lockedBuffer
	done   chan struct{}
	code   int
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startServe runs `recal --threads 2 serve --config recal.toml ARGS` on a
// free port and waits until it prints its URL.
func startServe(t *testing.T, args ...string) *serveProc {
	t.Helper()
	all := append([]string{"--threads", "2", "serve", "--config", "../../recal.toml", "--addr", "127.0.0.1:0"}, args...)
	b, _ := json.Marshal(all)
	p := &serveProc{cmd: exec.Command(os.Args[0], "-test.run=^TestServeHelper$"), stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "RECAL_SERVE_ARGS="+string(b))
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case p.url = <-lines:
	case <-p.done:
		t.Fatalf("recal serve exited with %d before serving: %s", p.code, p.stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("recal serve printed no URL in 2 minutes: %s", p.stderr.String())
	}
	if !strings.HasPrefix(p.url, "http://127.0.0.1:") || !strings.HasSuffix(p.url, "/v1") {
		t.Fatalf("recal serve printed %q, want its base URL", p.url)
	}
	return p
}

// root is the server's address without /v1.
func (p *serveProc) root() string { return strings.TrimSuffix(p.url, "/v1") }

func (p *serveProc) post(t *testing.T, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(p.url+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST: %v; server stderr: %s", err, p.stderr.String())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func question(q string, extra string) string {
	b, _ := json.Marshal(q)
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"messages":[{"role":"user","content":%s}]%s}`, b, extra)
}

// Startup errors exit non-zero before anything is served.
func TestServeStartupErrors(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	keyed := filepath.Join(dir, "keyed.toml")
	os.WriteFile(keyed, []byte(`[[models]]
name = "real"
description = "needs a key"
provider = "openai"
  [models.openai]
  base_url = "http://127.0.0.1:1/v1"
  model = "m"
  api_key_env = "RECAL_TEST_UNSET_POOL_KEY"
`), 0o644)
	os.Unsetenv("RECAL_TEST_UNSET_POOL_KEY")
	os.Unsetenv("RECAL_TEST_UNSET_CLIENT_KEY")
	base := []string{"--threads", "2", "serve", "--config", "../../recal.toml"}
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"no checkpoint", nil, 2, "--checkpoint is required"},
		{"not a checkpoint", []string{"--checkpoint", t.TempDir(), "--addr", "127.0.0.1:0"}, 1, "is not a policy"},
		{"port in use", []string{"--checkpoint", ck, "--addr", busy.Addr().String()}, 1, "address already in use"},
		{"bad address", []string{"--checkpoint", ck, "--addr", "nowhere"}, 2, "--addr"},
		{"unknown key", []string{"--checkpoint", ck, "--set", "serve.nope=1"}, 2, `unknown key "serve.nope"`},
		{"client key variable unset", []string{"--checkpoint", ck, "--set", "serve.api_key_env=RECAL_TEST_UNSET_CLIENT_KEY"}, 2, "RECAL_TEST_UNSET_CLIENT_KEY"},
		{"pool key variable unset", []string{"--checkpoint", ck, "--addr", "127.0.0.1:0", "--extra-models", keyed}, 1, "RECAL_TEST_UNSET_POOL_KEY"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append(base, c.args...)...)
			if code != c.code || !strings.Contains(stderr, c.says) {
				t.Fatalf("exit %d, stderr %q; want %d mentioning %q", code, stderr, c.code, c.says)
			}
			if stdout != "" {
				t.Errorf("stdout %q: a server that did not start printed its URL", stdout)
			}
		})
	}
}

func TestServeDryRun(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	code, stdout, stderr := runCLI(t, "serve", "--config", "../../recal.toml", "--checkpoint", ck, "--addr", "127.0.0.1:0", "--dry-run")
	if code != 0 || !strings.Contains(stdout, "recal-policy") || !strings.Contains(stdout, "no problem found") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and a summary naming the router", code, stdout, stderr)
	}
	// A training run's folder stands for its checkpoints/last (no best):
	// the summary names the router after the run and checks that checkpoint.
	run := filepath.Join(t.TempDir(), "myrun")
	step := filepath.Join(run, "checkpoints", "step-2")
	if err := os.CopyFS(step, os.DirFS(ck)); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"optimizer.safetensors", "trainer_state.json"} { // what makes a training checkpoint complete
		if _, err := os.Stat(filepath.Join(step, f)); err != nil {
			os.WriteFile(filepath.Join(step, f), []byte("{}"), 0o644)
		}
	}
	if err := os.Symlink("step-2", filepath.Join(run, "checkpoints", "last")); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, "serve", "--config", "../../recal.toml", "--checkpoint", run, "--addr", "127.0.0.1:0", "--dry-run")
	if code != 0 || !strings.Contains(stdout, "recal-myrun") || !strings.Contains(stdout, step) || !strings.Contains(stdout, "no problem found") {
		t.Fatalf("run folder: exit %d, stdout %q, stderr %q; want 0 and a summary naming recal-myrun and %s", code, stdout, stderr, step)
	}
	os.Remove(filepath.Join(run, "checkpoints", "last"))
	code, _, stderr = runCLI(t, "serve", "--config", "../../recal.toml", "--checkpoint", run, "--dry-run")
	if code != 2 || !strings.Contains(stderr, "no checkpoint yet") {
		t.Fatalf("run folder without a checkpoint: exit %d, stderr %q; want 2 saying it has none", code, stderr)
	}
	os.Unsetenv("RECAL_TEST_UNSET_CLIENT_KEY")
	code, _, stderr = runCLI(t, "serve", "--config", "../../recal.toml", "--checkpoint", t.TempDir(), "--dry-run",
		"--set", "serve.api_key_env=RECAL_TEST_UNSET_CLIENT_KEY")
	if code != 2 || !strings.Contains(stderr, "RECAL_TEST_UNSET_CLIENT_KEY") || !strings.Contains(stderr, "--checkpoint") {
		t.Fatalf("exit %d, stderr %q; want 2 listing the unset key variable and the bad checkpoint", code, stderr)
	}
}

// The real server (micro policy, sim pool) answers plain and streamed
// requests, refuses hostile ones cleanly, survives a client that hangs up
// mid-stream, and writes its trace and metrics.
func TestServeEndToEnd(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	// max_question_chars lets a question through that is too long in tokens.
	p := startServe(t, append([]string{"--checkpoint", ck, "--trace", trace, "--set", "serve.max_question_chars=20000"}, serveSets...)...)
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(p.root() + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v, want 200", path, resp, err)
		}
		resp.Body.Close()
	}
	resp, body := p.post(t, question("Who wrote Hamlet?", `"model":"recal-policy"`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var c struct {
		Object  string
		Choices []struct {
			Message      struct{ Role, Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
		Recal struct {
			End      string
			Response string
			Usage    struct {
				PolicyPromptTokens     int `json:"policy_prompt_tokens"`
				PolicyCompletionTokens int `json:"policy_completion_tokens"`
			}
		}
	}
	if err := json.Unmarshal(body, &c); err != nil || c.Object != "chat.completion" || len(c.Choices) != 1 {
		t.Fatalf("not a chat.completion: %s", body)
	}
	if c.Recal.Usage.PolicyPromptTokens < 20 || c.Recal.Usage.PolicyCompletionTokens < 1 || c.Usage.PromptTokens < c.Recal.Usage.PolicyPromptTokens || c.Recal.Response == "" || c.Recal.End == "" {
		t.Errorf("usage and recal object %s: want the policy's prompt and completion tokens, its response and why it ended", body)
	}

	hostile := []struct {
		name   string
		body   string
		status int
	}{
		{"2 MiB body", question(strings.Repeat("x", 2<<20), ""), 413},
		{"invalid JSON", `{"messages":`, 400},
		{"no user message", `{"messages":[{"role":"system","content":"x"}]}`, 400},
		{"50,000-character question", question(strings.Repeat("word ", 10000), ""), 400},
		{"invalid UTF-8", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400},
		{"unknown model", question("q", `"recal":{"models":["gpt-99"]}`), 400},
		{"n=3", question("q", `"n":3`), 400},
		{"question longer than the policy's context", question(strings.Repeat("zebra quokka ", 1200), ""), 400},
	}
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			resp, b := p.post(t, h.body)
			if resp.StatusCode != h.status || !bytes.Contains(b, []byte(`"error":{"message"`)) {
				t.Errorf("status %d %s, want %d with an OpenAI error", resp.StatusCode, b, h.status)
			}
			if strings.Contains(h.name, "context") && !bytes.Contains(b, []byte("tokens")) {
				t.Errorf("%s: want the backend's reason (the prompt's tokens against a row's)", b)
			}
		})
	}

	// A streaming client that hangs up after the first event.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/chat/completions", strings.NewReader(question("Who painted the Mona Lisa?", `"stream":true`)))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Read(make([]byte, 1))
		cancel()
		resp.Body.Close()
	}
	cancel()
	resp, body = p.post(t, question("Who wrote Hamlet?", `"stream":true,"stream_options":{"include_usage":true}`))
	if resp.StatusCode != 200 || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) || !bytes.Contains(body, []byte(`"choices":[],`)) {
		t.Errorf("streamed request after a disconnect: %d %s", resp.StatusCode, body)
	}
	mresp, err := http.Get(p.root() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	// 2 or 3 answered: the stream whose client hung up may have ended first.
	if !regexp.MustCompile(`recal_serve_requests_total\{code="200",handler="/v1/chat/completions"\} [23]\n`).Match(metrics) {
		t.Errorf("metrics do not count 2 or 3 answered requests:\n%s", metrics)
	}
	for _, want := range []string{`recal_serve_requests_total{code="413",handler="/v1/chat/completions"} 1`, "recal_serve_batch_rows 0", "recal_serve_queue_depth 0"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	if p.code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0: %s", p.code, p.stderr.String())
	}
	lines, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(lines), "\n"); n < 2 {
		t.Errorf("trace has %d lines, want one per admitted request", n)
	}
	if strings.Contains(p.stderr.String(), "Who wrote Hamlet") {
		t.Error("the access log holds a question although serve.log_content is false")
	}
	if !strings.Contains(p.stderr.String(), "request_id=") {
		t.Errorf("stderr has no access log lines with request ids: %s", p.stderr.String())
	}
}

// At temperature 0 the server answers exactly as recal eval's policy router
// does for the same checkpoint, pool and question.
func TestServeMatchesEval(t *testing.T) {
	ck, err := filepath.Abs(servePolicy) // it copies each question into its sub-query: responses differ per question
	if err != nil {
		t.Fatal(err)
	}
	questions := []string{"where does no game no life anime end?", "what languages are spoken in india the most?",
		"who wrote old flames cant hold a candle to you?", "Who wrote Hamlet?"}
	// Turns long enough to reach the sub-query, where the questions differ.
	args := append(append([]string(nil), serveSets...), "--set", "router.turn_tokens=40")
	sets := []string{"policy.checkpoint=" + ck, "policy.threads=2"}
	for i := 0; i+1 < len(args); i += 2 {
		if strings.HasPrefix(args[i+1], "router.") {
			sets = append(sets, args[i+1])
		}
	}
	cfg, err := config.Load("../../recal.toml", sets)
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.Open(t, ck, cfg)
	var want []rollout.QuestionResult
	for _, q := range questions {
		// The service shows simulated models the question alone (no id,
		// dataset or golden answers); so does this example. A fresh
		// environment per question: its prompt cache is keyed by id.
		r, err := eval.NewRouter("policy", eval.Setup{Env: env.WithPrompt(env.Prompt, env.Router), Batch: 1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Answer(context.Background(), []data.Example{{Question: q}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Response == "" {
			t.Fatalf("eval's response to %q is empty: nothing to compare", q)
		}
		want = append(want, res[0])
	}
	distinct := map[string]bool{}
	for _, w := range want {
		distinct[w.Response] = true
	}
	if len(distinct) < 2 {
		t.Fatalf("the policy answers every question alike (%q): the comparison would not tell questions apart", want[0].Response)
	}
	p := startServe(t, append([]string{"--checkpoint", ck}, args...)...)
	for i, q := range questions {
		resp, body := p.post(t, question(q, `"temperature":0`))
		var c struct {
			Choices []struct{ Message struct{ Content string } }
			Recal   struct{ Response string }
		}
		if resp.StatusCode != 200 || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("%q: status %d %s", q, resp.StatusCode, body)
		}
		t.Logf("%q: %q", q, c.Recal.Response)
		if c.Recal.Response != want[i].Response || c.Choices[0].Message.Content != want[i].Answer {
			t.Errorf("%q:\nserve answered %q with response %q,\neval answered  %q with response %q", q,
				c.Choices[0].Message.Content, c.Recal.Response, want[i].Answer, want[i].Response)
		}
	}
}

var updateServePolicy = flag.Bool("update-serve-policy", false,
	"remake testdata/serve-policy: a supervised warm-up of the tiny copy-circuit policy (minutes), stored in bfloat16")

// servePolicy is a policy that writes the protocol and calls the pool: the
// tiny copy-circuit policy after a short supervised warm-up on recal.toml's
// simulated pool, its weights stored in bfloat16 to keep the fixture small
// (loaded as float32). -update-serve-policy remakes it (makeServePolicy).
const servePolicy = "testdata/serve-policy"

// makeServePolicy writes servePolicy: recal policy init (tiny, copy
// circuit, a 3000-token vocabulary), recal train with sft.steps = 200 and no
// GRPO step, then the warm-up's checkpoint saved in bfloat16.
func makeServePolicy(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	tiny, run := filepath.Join(dir, "tiny"), filepath.Join(dir, "run")
	steps := [][]string{
		{"--threads", "2", "policy", "init", "--preset", "tiny", "--tokenizer", "../../tokenizer/qwen2.5", "--out", tiny, "--seed", "0",
			"--trim-corpus", "../../data/qa", "--trim-corpus", "../../router", "--trim-corpus", "../../recal.toml", "--trim-vocab", "3000", "--copy-circuit"},
		{"--threads", "2", "--log-level", "warn", "train", "--config", "../../recal.toml", "--run-dir", run, "--set", "policy.checkpoint=" + tiny,
			"--set", "sft.steps=200", "--set", "train.steps=0"},
	}
	for _, args := range steps {
		if code, _, stderr := runCLI(t, args...); code != 0 {
			t.Fatalf("recal %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
	}
	p, err := torchbridge.LoadPolicy(filepath.Join(run, "checkpoints", "sft"), torchbridge.Options{DType: "bfloat16"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Save(servePolicy); err != nil {
		t.Fatal(err)
	}
}

// At temperature 0 the server answers exactly as recal eval's policy router
// does, with a policy that calls the pool: the same response text, answer
// and pool calls (model, sub-query) per question, through the whole
// protocol (search, information, answer). Requests are sent one at a time,
// as eval decodes each question alone here (batch 1).
func TestServeMatchesEvalWithPoolCalls(t *testing.T) {
	if *updateServePolicy {
		makeServePolicy(t)
	}
	ck, err := filepath.Abs(servePolicy)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("../../recal.toml", []string{"policy.checkpoint=" + ck, "policy.threads=2"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Data.Test, cfg.Data.TestPerDataset = []string{"nq", "hotpotqa"}, 6
	examples, err := cfg.Data.LoadTest()
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.Open(t, ck, cfg)
	type call struct{ Model, Query string }
	type outcome struct {
		answer, response string
		calls            []call
	}
	var want []outcome
	calling := 0
	for _, ex := range examples {
		// The service shows simulated models the question alone (no id,
		// dataset or golden answers); so does this example. A fresh
		// environment per question: its prompt cache is keyed by id.
		r, err := eval.NewRouter("policy", eval.Setup{Env: env.WithPrompt(env.Prompt, env.Router), Batch: 1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Answer(context.Background(), []data.Example{{Question: ex.Question}})
		if err != nil {
			t.Fatal(err)
		}
		o := outcome{answer: res[0].Answer, response: res[0].Response}
		for _, c := range res[0].Calls {
			o.calls = append(o.calls, call{c.Model, c.Query})
		}
		if hasPoolCall(res[0].Calls) {
			calling++
		}
		want = append(want, o)
	}
	// Most questions must go through search → information → answer, or
	// the comparison would not cover the protocol.
	if calling*4 < len(examples)*3 {
		t.Fatalf("eval made a pool call for %d of %d questions, want at least 3 in 4: %s no longer calls the pool (remake it with -update-serve-policy)",
			calling, len(examples), servePolicy)
	}

	p := startServe(t, "--checkpoint", ck)
	for i, ex := range examples {
		resp, body := p.post(t, question(ex.Question, `"temperature":0`))
		var c struct {
			Choices []struct{ Message struct{ Content string } }
			Recal   struct {
				Response string
				Trace    []struct {
					Model    string `json:"model"`
					SubQuery string `json:"sub_query"`
				}
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("%q: status %d %s", ex.Question, resp.StatusCode, body)
		}
		got := outcome{answer: c.Choices[0].Message.Content, response: c.Recal.Response}
		for _, e := range c.Recal.Trace {
			got.calls = append(got.calls, call{e.Model, e.SubQuery})
		}
		if got.answer != want[i].answer || got.response != want[i].response || !slices.Equal(got.calls, want[i].calls) {
			t.Errorf("%q at temperature 0:\nserve answered %q after calls %q, response %q;\neval answered  %q after calls %q, response %q",
				ex.Question, got.answer, got.calls, got.response, want[i].answer, want[i].calls, want[i].response)
		}
	}
	t.Logf("%d questions, %d with pool calls: serve and eval agree on each", len(examples), calling)
}

// hasPoolCall reports whether a response called a pool model (not an
// unknown name or a refused search).
func hasPoolCall(calls []router.Call) bool {
	for _, c := range calls {
		if !c.Unknown && !c.Refused {
			return true
		}
	}
	return false
}

// SIGTERM with requests in flight: every request decoding or queued at
// the signal completes with a 200, and the process exits 0. How many of the
// 16 requests are in flight together depends on the machine's speed (on a
// fast one the first finish before the last arrive), so the test counts
// them at the signal instead of waiting for all 16.
func TestServeSIGTERM(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	// Long turns, decoded one request at a time, keep requests queued.
	p := startServe(t, "--checkpoint", ck, "--set", "router.turn_tokens=160", "--set", "router.max_turns=1",
		"--set", "serve.max_batch=1", "--set", "serve.max_queue=16", "--set", "serve.drain_timeout=5m")
	codes := make(chan string, 16)
	for i := range 16 {
		go func() {
			resp, err := http.Post(p.url+"/chat/completions", "application/json", strings.NewReader(question(fmt.Sprintf("Question number %d?", i), "")))
			if err != nil {
				codes <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"chat.completion"`)) {
				codes <- fmt.Sprintf("%d %s", resp.StatusCode, b)
				return
			}
			codes <- "ok"
		}()
	}
	var inflight int
	deadline := time.Now().Add(time.Minute)
	for inflight < 2 {
		resp, err := http.Get(p.root() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		var st struct{ Active, Waiting int }
		json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		inflight = st.Active + st.Waiting
		if len(codes) == 16 || time.Now().After(deadline) {
			t.Fatalf("fewer than 2 of 16 requests ever in flight together (%d ended, %d in flight at the deadline)", len(codes), inflight)
		}
		if inflight < 2 {
			time.Sleep(time.Millisecond)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGTERM with %d requests in flight", inflight)
	ok := 0
	for range 16 {
		if c := <-codes; c == "ok" {
			ok++
		} else if strings.HasPrefix(c, "200 ") || strings.HasPrefix(c, "500 ") {
			t.Errorf("a request ended with %s: a request the server took must complete", c)
		}
	}
	// Requests that ended before the signal count too; those not yet taken
	// at the signal may be refused (connection refused, 503).
	if ok < inflight {
		t.Errorf("%d requests completed, fewer than the %d in flight at SIGTERM: the drain dropped some", ok, inflight)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("recal serve did not exit within a minute of SIGTERM")
	}
	if p.code != 0 {
		t.Errorf("exit status %d, want 0: %s", p.code, p.stderr.String())
	}
	if _, err := http.Get(p.root() + "/healthz"); err == nil {
		t.Error("the server still answers after exiting")
	}
}

// With serve.api_key_env and serve.metrics_addr, the real server serves
// /metrics on its own address, behind the token, and not on serve.addr;
// the token's scheme is case-insensitive. SIGTERM closes both addresses.
func TestServeMetricsAddr(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	t.Setenv("RECAL_TEST_SERVE_CLIENT_KEY", "client-key-42")
	p := startServe(t, append([]string{"--checkpoint", ck, "--set", "serve.api_key_env=RECAL_TEST_SERVE_CLIENT_KEY",
		"--set", "serve.metrics_addr=127.0.0.1:0"}, serveSets...)...)
	// The log line is written before the URL on stdout, but stderr reaches
	// p.stderr through a goroutine of its own: it may arrive after the URL.
	re := regexp.MustCompile(`metrics=(http://127\.0\.0\.1:[0-9]+/metrics)`)
	m := re.FindStringSubmatch(p.stderr.String())
	for deadline := time.Now().Add(10 * time.Second); m == nil && time.Now().Before(deadline); m = re.FindStringSubmatch(p.stderr.String()) {
		time.Sleep(10 * time.Millisecond)
	}
	if m == nil {
		t.Fatalf("the serving log line names no metrics URL: %s", p.stderr.String())
	}
	get := func(url, auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		url, auth string
		status    int
		has       string
	}{
		{m[1], "", 401, "invalid_api_key"},
		{m[1], "Bearer client-key-42", 200, "recal_serve_requests_total"},
		{p.root() + "/metrics", "Bearer client-key-42", 404, "serve.metrics_addr"},
		{p.url + "/models", "bearer client-key-42", 200, "recal-policy"},
		{p.url + "/models", "BEARER client-key-41", 401, "invalid_api_key"},
	} {
		if code, b := get(c.url, c.auth); code != c.status || !strings.Contains(b, c.has) {
			t.Errorf("GET %s with %q: %d %.200s; want %d and %q", c.url, c.auth, code, b, c.status, c.has)
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	if p.code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0: %s", p.code, p.stderr.String())
	}
	if _, err := http.Get(m[1]); err == nil {
		t.Error("serve.metrics_addr still answers after the server exited")
	}
}

// The official OpenAI SDK (npm package openai, scripts/e2e) drives the real
// server: a plain request, a streamed one with include_usage, one
// restricted with recal.models, and a refused one.
func TestServeOpenAISDK(t *testing.T) {
	node, err1 := exec.LookPath("node")
	npm, err2 := exec.LookPath("npm")
	if err1 != nil || err2 != nil {
		t.Skip("node and npm are not installed: the OpenAI SDK end-to-end test needs them (scripts/e2e)")
	}
	e2e := filepath.Join("..", "..", "scripts", "e2e")
	if _, err := os.Stat(filepath.Join(e2e, "node_modules", "openai", "package.json")); err != nil {
		install := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		install.Dir = e2e
		if out, err := install.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in scripts/e2e (installs the openai package from package-lock.json): %v\n%s", err, out)
		}
	}
	ck := testpolicy.Micro(t, "../..", 1)
	t.Setenv("RECAL_TEST_CLIENT_KEY", "e2e-token")
	p := startServe(t, append([]string{"--checkpoint", ck, "--set", "serve.api_key_env=RECAL_TEST_CLIENT_KEY"}, serveSets...)...)
	sdk := exec.Command(node, "sdk.mjs")
	sdk.Dir = e2e
	sdk.Env = append(os.Environ(), "RECAL_URL="+p.url, "RECAL_API_KEY=e2e-token")
	var stderr bytes.Buffer
	sdk.Stderr = &stderr
	out, err := sdk.Output()
	if err != nil {
		t.Fatalf("sdk.mjs: %v: %s\nserver: %s", err, stderr.String(), p.stderr.String())
	}
	var summary struct {
		Router string
		Plain  struct {
			Answer string
			Usage  struct {
				TotalTokens int `json:"total_tokens"`
			}
			Trace []any
		}
		Stream struct {
			Answer string
			Chunks int
		}
		UnknownModel struct{ Status int } `json:"unknown_model"`
	}
	if err := json.Unmarshal(out, &summary); err != nil {
		t.Fatalf("sdk.mjs printed %q: %v", out, err)
	}
	if summary.Router != "recal-policy" || summary.Plain.Usage.TotalTokens == 0 || summary.Plain.Trace == nil ||
		summary.Stream.Answer != summary.Plain.Answer || summary.Stream.Chunks < 3 || summary.UnknownModel.Status != 400 {
		t.Errorf("the SDK saw %s", out)
	}
}

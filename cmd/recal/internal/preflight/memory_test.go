package preflight

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/tokenizer"
)

var update = flag.Bool("update", false, "rewrite testdata/qwen2.5-3b.txt from the plans (TestPaperSettingPlans)")

func qwen3B(t *testing.T) *hfmodel.Config {
	t.Helper()
	m, err := hfmodel.Preset("qwen2.5-3b", 151936)
	if err != nil {
		t.Fatal(err)
	}
	m.MaxPositionEmbeddings = 32768 // Qwen2.5-3B-Instruct's config.json
	return m
}

// The workload follows the config: a rank's share of the batch, the
// micro-batches of a mini-batch, the KL reference of the algorithm's own
// coefficient (PPO's KL is in the reward, weighed by ppo.kl_coef).
func TestOptions(t *testing.T) {
	base := config.Default()
	base.Train.BatchSize, base.Train.GroupSize, base.Train.MicroBatch = 64, 4, 16
	for _, c := range []struct {
		name                      string
		edit                      func(*config.Config)
		job                       Job
		rows, micro, microBatches int
		kl                        bool
		seqLen                    int
	}{
		{"one rank", func(*config.Config) {}, Job{Train: true, World: 1}, 256, 16, 16, true, 600},
		{"4 ranks", func(*config.Config) {}, Job{Train: true, World: 4}, 64, 16, 4, true, 600},
		{"2 mini-batches", func(c *config.Config) { c.Train.MiniBatches = 2 }, Job{Train: true, World: 4}, 64, 16, 2, true, 600},
		{"micro-batch larger than a rank's rows", func(c *config.Config) { c.Train.MicroBatch = 500 }, Job{Train: true, World: 8}, 32, 32, 1, true, 600},
		{"rollout rows", func(c *config.Config) { c.Train.RolloutRows = 10 }, Job{Train: true, World: 1}, 10, 16, 16, true, 600},
		{"rollout rows above the share", func(c *config.Config) { c.Train.RolloutRows = 1000 }, Job{Train: true, World: 2}, 128, 16, 8, true, 600},
		{"no kl", func(c *config.Config) { c.Train.KLCoef = 0 }, Job{Train: true, World: 1}, 256, 16, 16, false, 600},
		{"ppo, ppo.kl_coef", func(c *config.Config) { c.Train.Algorithm = "ppo"; c.Train.KLCoef = 0; c.PPO.KLCoef = 0.01 }, Job{Train: true, World: 1}, 256, 16, 16, true, 600},
		{"ppo, train.kl_coef only", func(c *config.Config) { c.Train.Algorithm = "ppo"; c.Train.KLCoef = 0.1; c.PPO.KLCoef = 0 }, Job{Train: true, World: 1}, 256, 16, 16, false, 600},
		{"eval", func(*config.Config) {}, Job{World: 1, Rows: 64, RowsKey: "eval.batch"}, 64, 0, 0, false, 0},
		{"world 0", func(*config.Config) {}, Job{Train: true}, 256, 16, 16, true, 600},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base
			c.edit(&cfg)
			o := Options(cfg, c.job, 100, 500, 4096)
			if o.RolloutRows != c.rows || o.MicroSeqs != c.micro || o.MicroBatches != c.microBatches || o.KLReference != c.kl || o.SeqLen != c.seqLen {
				t.Errorf("rows %d, micro-batch %d × %d, KL %v, length %d; want %d, %d × %d, %v, %d",
					o.RolloutRows, o.MicroSeqs, o.MicroBatches, o.KLReference, o.SeqLen, c.rows, c.micro, c.microBatches, c.kl, c.seqLen)
			}
			if o.Capacity != 600 || o.PromptLen != 100 {
				t.Errorf("capacity %d after a %d-token prompt, want 600 after 100", o.Capacity, o.PromptLen)
			}
		})
	}
	if o := Options(base, Job{Train: true}, 4000, 500, 4096); o.Capacity != 4096 || o.SeqLen != 4096 {
		t.Errorf("capacity %d, sequences %d; want the context's 4096", o.Capacity, o.SeqLen)
	}
}

func TestDeviceMemory(t *testing.T) {
	const meminfo = "MemTotal:       24684092 kB\nMemFree:  100 kB\n"
	for _, c := range []struct {
		name    string
		pc      config.Policy
		world   int
		meminfo string
		bytes   int64
		source  string
	}{
		{"cpu", config.Policy{Device: "cpu"}, 1, meminfo, 24684092 << 10, "MemTotal"},
		{"cpu, 2 ranks share it", config.Policy{Device: "cpu"}, 2, meminfo, (24684092 << 10) / 2, "MemTotal / 2 ranks"},
		{"set", config.Policy{Device: "cpu", DeviceMemory: 1.5}, 4, meminfo, 3 << 29, "policy.device_memory"},
		{"gpu, unknown", config.Policy{Device: "cuda"}, 1, meminfo, 0, ""},
		{"gpu, set", config.Policy{Device: "cuda:1", DeviceMemory: 80}, 8, meminfo, 80 << 30, "policy.device_memory"},
		{"gpu, read", config.Policy{Device: "cuda:1"}, 8, meminfo, 79 << 30, "cuda:1's memory, as read"},
		{"gpu, set wins over read", config.Policy{Device: "cuda", DeviceMemory: 40}, 1, meminfo, 40 << 30, "policy.device_memory"},
		{"gpu, unreadable", config.Policy{Device: "cuda:7"}, 1, meminfo, 0, ""},
		{"no meminfo", config.Policy{Device: "cpu"}, 1, "", 0, ""},
		{"garbled meminfo", config.Policy{Device: "cpu"}, 1, "MemTotal: lots kB", 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			read := func(dev string) (int64, error) {
				if dev == "cuda:7" {
					return 0, fmt.Errorf("no such device")
				}
				return 79 << 30, nil
			}
			if c.name == "gpu, unknown" {
				read = nil
			}
			b, s := DeviceMemory(c.pc, c.world, c.meminfo, read)
			if b != c.bytes || s != c.source {
				t.Errorf("%d bytes from %q, want %d from %q", b, s, c.bytes, c.source)
			}
		})
	}
}

// Remedy's settings make the plan fit, and the search stops at the first
// that does.
func TestRemedy(t *testing.T) {
	m := qwen3B(t)
	cfg := config.Default()
	cfg.Policy.Device, cfg.Policy.DType = "cuda", "bfloat16"
	cfg.Train.BatchSize, cfg.Train.GroupSize, cfg.Train.MicroBatch, cfg.Train.KLCoef = 64, 4, 16, 0.001
	job := Job{Train: true, World: 4}
	avail := int64(80) << 30
	sets, fixed := Remedy(cfg, m, job, 500, 1500, 32768, avail)
	if sets == nil {
		t.Fatal("no remedy for the 3B policy on 4 × 80 GB")
	}
	if p := m.PlanMemory(Options(fixed, job, 500, 1500, 32768)); p.Peak() > avail {
		t.Errorf("with %v the peak is %.2f GiB, over 80", sets, hfmodel.GiB(p.Peak()))
	}
	if !fixed.Policy.GradientCheckpointing || sets[0] != "--set policy.gradient_checkpointing=true" {
		t.Errorf("remedy %v: want checkpointing first", sets)
	}
	if p := m.PlanMemory(Options(cfg, job, 500, 1500, 32768)); p.Peak() <= avail {
		t.Errorf("the plan fits without a remedy (%.2f GiB); the test wants one that does not", hfmodel.GiB(p.Peak()))
	}
	if sets, _ := Remedy(cfg, m, job, 500, 1500, 32768, 1<<30); sets != nil {
		t.Error("a remedy for 1 GiB: the 3B weights alone are 5.7 GiB")
	}
	if sets, _ := Remedy(cfg, m, Job{World: 1, Rows: 64}, 500, 1500, 32768, 1<<30); sets != nil {
		t.Error("a training remedy for an inference job")
	}
}

// A hostile group size (--set train.group_size=1000000: 64 million rows)
// gets its verdict at once, the largest rollout_rows that fits found by
// bisection: it fits, and one more row does not. A search row by row took
// minutes.
func TestRemedyHugeGroup(t *testing.T) {
	m := qwen3B(t)
	cfg := config.Default()
	cfg.Policy.Device, cfg.Policy.DType = "cuda", "bfloat16"
	cfg.Train.BatchSize, cfg.Train.GroupSize, cfg.Train.MicroBatch = 64, 1000000, 4
	job := Job{Train: true, World: 1}
	avail := int64(80) << 30
	start := time.Now()
	sets, fixed := Remedy(cfg, m, job, 500, 1500, 32768, avail)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Remedy took %s at group_size 10^6; want well under 5 s", d)
	}
	rows := fixed.Train.RolloutRows
	if len(sets) == 0 || sets[len(sets)-1] != fmt.Sprintf("--set train.rollout_rows=%d", rows) || rows < 1 {
		t.Fatalf("remedy %v (rollout_rows %d): want rollout_rows last", sets, rows)
	}
	target := int64(float64(avail) * (1 - Headroom))
	if p := m.PlanMemory(Options(fixed, job, 500, 1500, 32768)); p.Rollout.Peak() > target {
		t.Errorf("rollout_rows %d does not fit: %.2f GiB", rows, hfmodel.GiB(p.Rollout.Peak()))
	}
	fixed.Train.RolloutRows = rows + 1
	if p := m.PlanMemory(Options(fixed, job, 500, 1500, 32768)); p.Rollout.Peak() <= target {
		t.Errorf("rollout_rows %d fits too: the remedy must name the largest count", rows+1)
	}
}

var remedyRE = regexp.MustCompile(`it fits with (.*)$`)

// The paper's setting (configs/qwen2.5-3b-nim.toml: Qwen2.5-3B in
// bfloat16, 64 questions × 4 responses a step, the data and prompt it
// names, tokenised by Qwen2.5's tokenizer) on 1 × 80 GB, 4 × 80 GB and
// 8 × 40 GB: the dry run's memory lines, and where it does not fit, the
// settings it names and the plan with them. docs/memory.md quotes
// testdata/qwen2.5-3b.txt; -update rewrites it.
func TestPaperSettingPlans(t *testing.T) {
	const path = "../../../../configs/qwen2.5-3b-nim.toml"
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load("../../../../tokenizer/qwen2.5")
	if err != nil {
		t.Fatal(err)
	}
	m := qwen3B(t)
	base := New("train")
	base.TrainData(cfg.Data, false)
	base.Pool(cfg.Pool, cfg.Router)
	base.tok, base.ctxLen = tok, m.MaxPositionEmbeddings
	var out strings.Builder
	for _, d := range []struct {
		world   int
		gib     float64
		extra   []string // settings beyond the paper's
		fits    bool     // whether the search finds settings that fit
		shipped bool     // the config as shipped fits, no setting added
	}{{8, 80, nil, true, true}, {1, 80, nil, true, false}, {4, 80, nil, true, false}, {8, 40, nil, true, false}} {
		sets := append([]string{fmt.Sprintf("policy.device_memory=%g", d.gib)}, d.extra...)
		for try := 0; try < 2; try++ {
			c, err := config.Load(path, sets)
			if err != nil {
				t.Fatal(err)
			}
			chk := &Check{command: "train", tok: base.tok, prompt: base.prompt, longest: base.longest, ctxLen: base.ctxLen, capacity: base.capacity}
			chk.Memory(c, m, Job{Train: true, World: d.world})
			fmt.Fprintf(&out, "$ recal train --config configs/qwen2.5-3b-nim.toml --nproc %d --set %s --dry-run\n", d.world, strings.Join(sets, " --set "))
			out.WriteString(chk.summary.String())
			for _, p := range chk.problems {
				fmt.Fprintf(&out, "PROBLEM %s\n", p)
			}
			out.WriteString("\n")
			if d.shipped && len(chk.problems) > 0 {
				t.Errorf("%d × %g GiB: the config as shipped does not fit: %s", d.world, d.gib, chk.problems[0])
			}
			if len(chk.problems) == 0 {
				break
			}
			mt := remedyRE.FindStringSubmatch(chk.problems[0])
			if mt == nil && !d.fits {
				break
			}
			if mt == nil {
				t.Fatalf("%d × %g GiB does not fit and names no remedy: %s\n%s", d.world, d.gib, chk.problems[0], out.String())
			}
			if !d.fits {
				t.Fatalf("%d × %g GiB: want no remedy, got %s", d.world, d.gib, mt[1])
			}
			if try == 1 {
				t.Fatalf("%d × %g GiB: the remedy's settings %v do not fit: %s", d.world, d.gib, sets, chk.problems[0])
			}
			for _, s := range strings.Split(mt[1], " ") {
				if s != "--set" {
					sets = append(sets, s)
				}
			}
		}
	}
	golden := filepath.Join("testdata", "qwen2.5-3b.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test ./cmd/recal/internal/preflight -run TestPaperSettingPlans -update writes it)", err)
	}
	if string(want) != out.String() {
		t.Errorf("the plans changed; if that is meant, rewrite %s (and docs/memory.md) with -update:\n%s", golden, out.String())
	}
}

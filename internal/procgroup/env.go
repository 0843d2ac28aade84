package procgroup

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Launch says which rank this process is and where the group meets, as the
// launcher set it in the environment.
type Launch struct {
	Launcher   string // "torchrun", "slurm", or "" for a plain single process
	Rank       int    // this process, in [0, WorldSize)
	WorldSize  int    // number of processes
	LocalRank  int    // rank among the processes of this node (its GPU index)
	MasterAddr string // host of the rendezvous store, which rank 0 serves; empty for one process
	MasterPort int    // its TCP port; 0 for one process
	// StorePrefix is not empty when the launcher serves the store at
	// MasterAddr:MasterPort itself (torchrun's agent store,
	// TORCHELASTIC_USE_AGENT_STORE=True): every rank connects as a client
	// and keys its entries under it, "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>",
	// as torch.distributed does.
	StorePrefix string
}

// Distributed reports whether there is more than one rank.
func (l Launch) Distributed() bool { return l.WorldSize > 1 }

// FromEnv reads the launch from the process environment; see ParseEnv.
func FromEnv() (Launch, error) { return ParseEnv(os.LookupEnv) }

// ParseEnv reads the launch from environment variables, looked up by lookup
// (os.LookupEnv in FromEnv):
//
//   - torchrun (or any launcher that sets RANK or WORLD_SIZE): RANK,
//     WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, all required;
//     with TORCHELASTIC_USE_AGENT_STORE=True the store is torchrun's
//     agent's, and TORCHELASTIC_RESTART_COUNT is required too (StorePrefix);
//   - Slurm (srun; SLURM_PROCID set, RANK and WORLD_SIZE not): SLURM_PROCID,
//     SLURM_NTASKS and SLURM_LOCALID, with MASTER_ADDR and MASTER_PORT from
//     the environment (the job script exports them, e.g. the first host of
//     SLURM_JOB_NODELIST and a free port);
//   - neither: a single process, rank 0 of 1.
//
// MASTER_ADDR and MASTER_PORT are not needed when the world size is 1. An
// error names the variable that is missing or wrong.
func ParseEnv(lookup func(string) (string, bool)) (Launch, error) {
	_, rank := lookup("RANK")
	_, world := lookup("WORLD_SIZE")
	_, procid := lookup("SLURM_PROCID")
	e := envReader{lookup: lookup}
	var l Launch
	switch {
	case rank || world:
		e.launcher = "torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)"
		l = Launch{Launcher: "torchrun", Rank: e.int("RANK"), WorldSize: e.int("WORLD_SIZE"), LocalRank: e.int("LOCAL_RANK")}
		if e.err == nil {
			e.bounds("RANK", l.Rank, "WORLD_SIZE", l.WorldSize)
		}
	case procid:
		e.launcher = "Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR, MASTER_PORT)"
		l = Launch{Launcher: "slurm", Rank: e.int("SLURM_PROCID"), WorldSize: e.int("SLURM_NTASKS"), LocalRank: e.int("SLURM_LOCALID")}
		if e.err == nil {
			e.bounds("SLURM_PROCID", l.Rank, "SLURM_NTASKS", l.WorldSize)
		}
	default:
		return Launch{WorldSize: 1}, nil
	}
	if e.err == nil && l.LocalRank < 0 {
		name := map[string]string{"torchrun": "LOCAL_RANK", "slurm": "SLURM_LOCALID"}[l.Launcher]
		e.fail(name, strconv.Itoa(l.LocalRank), "want at least 0")
	}
	if e.err == nil && l.WorldSize > 1 {
		l.MasterAddr = e.str("MASTER_ADDR")
		l.MasterPort = e.int("MASTER_PORT")
		if e.err == nil && (l.MasterPort < 1 || l.MasterPort > 65535) {
			e.fail("MASTER_PORT", strconv.Itoa(l.MasterPort), "want 1 to 65535")
		}
		// torchrun (static rendezvous, its default in torch 1.x) serves
		// the store from its agent and says so; the workers then use it
		// under the restart's prefix (torch/distributed/rendezvous.py).
		if v, _ := lookup("TORCHELASTIC_USE_AGENT_STORE"); e.err == nil && v == "True" {
			attempt := e.int("TORCHELASTIC_RESTART_COUNT")
			if e.err == nil && attempt < 0 {
				e.fail("TORCHELASTIC_RESTART_COUNT", strconv.Itoa(attempt), "want at least 0")
			}
			l.StorePrefix = "/worker/attempt_" + strconv.Itoa(attempt)
		}
	}
	if e.err != nil {
		return Launch{}, e.err
	}
	return l, nil
}

// envReader reads variables, keeping the first error.
type envReader struct {
	lookup   func(string) (string, bool)
	launcher string // for messages: the launch the variables were read for
	err      error
}

func (e *envReader) fail(name, value, why string) {
	if e.err == nil {
		e.err = fmt.Errorf("dist: %s=%q: %s (launch by %s)", name, value, why, e.launcher)
	}
}

func (e *envReader) str(name string) string {
	if e.err != nil {
		return ""
	}
	v, ok := e.lookup(name)
	v = strings.TrimSpace(v)
	if !ok || v == "" {
		e.err = fmt.Errorf("dist: %s is not set (launch by %s)", name, e.launcher)
	}
	return v
}

func (e *envReader) int(name string) int {
	s := e.str(name)
	if e.err != nil {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		e.fail(name, s, "not an integer")
	}
	return n
}

// bounds checks 0 ≤ rank < world.
func (e *envReader) bounds(rankName string, rank int, worldName string, world int) {
	switch {
	case world < 1:
		e.fail(worldName, strconv.Itoa(world), "want at least 1")
	case rank < 0 || rank >= world:
		e.fail(rankName, strconv.Itoa(rank), fmt.Sprintf("want 0 to %d (%s=%d)", world-1, worldName, world))
	}
}

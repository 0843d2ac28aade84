package procgroup

import (
	"strings"
	"testing"
)

func TestParseEnv(t *testing.T) {
	torchrun := map[string]string{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
	slurm := map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	tests := []struct {
		name    string
		env     map[string]string
		want    Launch
		wantErr string // substring; empty: no error
	}{
		{"nothing set is one process", map[string]string{"PATH": "/bin"}, Launch{WorldSize: 1}, ""},
		{"torchrun", torchrun, Launch{Launcher: "torchrun", Rank: 1, WorldSize: 4, LocalRank: 1, MasterAddr: "node0", MasterPort: 29500}, ""},
		{"torchrun wins over slurm", with(slurm, "RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "1"), Launch{Launcher: "torchrun", Rank: 1, WorldSize: 4, LocalRank: 1, MasterAddr: "node0", MasterPort: 29500}, ""},
		{"torchrun of one needs no master", map[string]string{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, Launch{Launcher: "torchrun", WorldSize: 1}, ""},
		{"slurm", slurm, Launch{Launcher: "slurm", Rank: 5, WorldSize: 8, LocalRank: 1, MasterAddr: "node0", MasterPort: 29500}, ""},
		{"slurm of one needs no master", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}, Launch{Launcher: "slurm", WorldSize: 1}, ""},
		{"torchrun's agent store", with(torchrun, "TORCHELASTIC_USE_AGENT_STORE", "True", "TORCHELASTIC_RESTART_COUNT", "2"),
			Launch{Launcher: "torchrun", Rank: 1, WorldSize: 4, LocalRank: 1, MasterAddr: "node0", MasterPort: 29500, StorePrefix: "/worker/attempt_2"}, ""},
		{"no agent store unless True", with(torchrun, "TORCHELASTIC_USE_AGENT_STORE", "False", "TORCHELASTIC_RESTART_COUNT", "0"),
			Launch{Launcher: "torchrun", Rank: 1, WorldSize: 4, LocalRank: 1, MasterAddr: "node0", MasterPort: 29500}, ""},
		{"agent store without restart count", with(torchrun, "TORCHELASTIC_USE_AGENT_STORE", "True"), Launch{}, "dist: TORCHELASTIC_RESTART_COUNT is not set"},
		{"spaces are trimmed", with(torchrun, "RANK", " 2 "), Launch{Launcher: "torchrun", Rank: 2, WorldSize: 4, LocalRank: 1, MasterAddr: "node0", MasterPort: 29500}, ""},

		{"torchrun without WORLD_SIZE", with(torchrun, "WORLD_SIZE", "<unset>"), Launch{}, "dist: WORLD_SIZE is not set (launch by torchrun"},
		{"torchrun without RANK", with(torchrun, "RANK", "<unset>"), Launch{}, "dist: RANK is not set"},
		{"torchrun without LOCAL_RANK", with(torchrun, "LOCAL_RANK", "<unset>"), Launch{}, "dist: LOCAL_RANK is not set"},
		{"torchrun without MASTER_ADDR", with(torchrun, "MASTER_ADDR", "<unset>"), Launch{}, "dist: MASTER_ADDR is not set"},
		{"empty MASTER_ADDR", with(torchrun, "MASTER_ADDR", ""), Launch{}, "dist: MASTER_ADDR is not set"},
		{"torchrun without MASTER_PORT", with(torchrun, "MASTER_PORT", "<unset>"), Launch{}, "dist: MASTER_PORT is not set"},
		{"RANK not a number", with(torchrun, "RANK", "one"), Launch{}, `dist: RANK="one": not an integer`},
		{"RANK past WORLD_SIZE", with(torchrun, "RANK", "4"), Launch{}, `dist: RANK="4": want 0 to 3 (WORLD_SIZE=4)`},
		{"negative RANK", with(torchrun, "RANK", "-1"), Launch{}, `dist: RANK="-1": want 0 to 3`},
		{"WORLD_SIZE zero", with(torchrun, "WORLD_SIZE", "0", "RANK", "0"), Launch{}, `dist: WORLD_SIZE="0": want at least 1`},
		{"negative LOCAL_RANK", with(torchrun, "LOCAL_RANK", "-2"), Launch{}, `dist: LOCAL_RANK="-2": want at least 0`},
		{"MASTER_PORT out of range", with(torchrun, "MASTER_PORT", "70000"), Launch{}, `dist: MASTER_PORT="70000": want 1 to 65535`},
		{"MASTER_PORT not a number", with(torchrun, "MASTER_PORT", "http"), Launch{}, `dist: MASTER_PORT="http": not an integer`},
		{"slurm without SLURM_NTASKS", with(slurm, "SLURM_NTASKS", "<unset>"), Launch{}, "dist: SLURM_NTASKS is not set (launch by Slurm"},
		{"slurm without SLURM_LOCALID", with(slurm, "SLURM_LOCALID", "<unset>"), Launch{}, "dist: SLURM_LOCALID is not set"},
		{"slurm without MASTER_ADDR", with(slurm, "MASTER_ADDR", "<unset>"), Launch{}, "dist: MASTER_ADDR is not set (launch by Slurm"},
		{"SLURM_PROCID past SLURM_NTASKS", with(slurm, "SLURM_PROCID", "8"), Launch{}, `dist: SLURM_PROCID="8": want 0 to 7 (SLURM_NTASKS=8)`},
		{"negative SLURM_LOCALID", with(slurm, "SLURM_LOCALID", "-1"), Launch{}, `dist: SLURM_LOCALID="-1": want at least 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEnv(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseEnv(%v) error = %v, want one containing %q: a bad launch must name the variable", tt.env, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseEnv(%v): %v", tt.env, err)
			}
			if got != tt.want {
				t.Errorf("ParseEnv(%v) = %+v, want %+v", tt.env, got, tt.want)
			}
			if got.Distributed() != (tt.want.WorldSize > 1) {
				t.Errorf("Distributed() = %v for world size %d", got.Distributed(), got.WorldSize)
			}
		})
	}
}

package trainer

import (
	"strings"
	"time"

	"github.com/recal-project/recal/torchbridge"
)

// phases times a GRPO step's phases and, on a GPU, reads the CUDA caching
// allocator's peak of memory held by tensors in each (the counters the
// memory plan's phases are checked against): rollout (decoding), reference
// (the KL reference's scoring), update (the loss's forwards and backwards)
// and step (the gradient reduction and the optimizer step). Each mark ends
// the phase under way and starts the next.
type phases struct {
	device string // "" on the CPU: no memory counters
	start  time.Time
	secs   map[string]float64
	gib    map[string]float64
}

func newPhases(device string) *phases {
	ph := &phases{start: time.Now(), secs: map[string]float64{}}
	if strings.HasPrefix(device, "cuda") {
		if _, err := torchbridge.DeviceMemory(device, true); err == nil {
			ph.device, ph.gib = device, map[string]float64{}
		}
	}
	return ph
}

// mark ends phase: its time is added, its peak kept (the largest over the
// step's mini-batches), and the peak counter reset for the next phase.
func (ph *phases) mark(phase string) {
	now := time.Now()
	ph.secs[phase] += now.Sub(ph.start).Seconds()
	ph.start = now
	if ph.device == "" {
		return
	}
	if st, err := torchbridge.DeviceMemory(ph.device, true); err == nil {
		ph.gib[phase] = max(ph.gib[phase], float64(st.PeakAllocated)/(1<<30))
	}
}

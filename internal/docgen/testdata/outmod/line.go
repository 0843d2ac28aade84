// Package outmod holds the types TestOutputsPage describes.
package outmod

import (
	"time"

	"example.com/outmod/sub"
)

// Line is one line of a file.
type Line struct {
	Step int `json:"step"` // the step
	// Rewards by component.
	Rewards map[string]float64 `json:"rewards"`
	Calls   []sub.Call         `json:"calls"`
	Hidden  string             `json:"-"`
	private int
	Took    time.Duration `json:"took_ns,omitempty"`
	*Extra                // set for PPO only
	Kind    Kind          `json:"kind"` // a named string
	NoTag   bool
	// First and Second are documented together.
	First  int `json:"first"`
	Second int `json:"second"`
	Third  int `json:"third"`
}

// Extra is inlined into Line.
type Extra struct {
	Loss float64 `json:"loss"` // value loss
}

// Kind is a named string.
type Kind string

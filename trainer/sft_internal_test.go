package trainer

import "testing"

// demoAnswer: the golden answer a reply contains, else the answer it
// states, else nothing (a demonstration then ends after the reply).
func TestDemoAnswer(t *testing.T) {
	golden := []string{"beneath the liver", "under the liver"}
	for _, c := range []struct {
		reply           string
		answer          string
		correct, stated bool
	}{
		{"The answer is beneath the liver.", "beneath the liver", true, true},
		{"[simulated sim-a] The answer is Lyon.", "Lyon", false, true},
		{"I think the answer is: a small organ near the stomach, on the right side of it.", ": a small organ near the stomach, on", false, true},
		{"The gallbladder sits in a fossa of the visceral surface.", "", false, false},
		{"[pool error: model gpt4 unavailable]", "", false, false},
		{"", "", false, false},
	} {
		a, correct, stated := demoAnswer(c.reply, golden)
		if a != c.answer || correct != c.correct || stated != c.stated {
			t.Errorf("demoAnswer(%q) = %q, %v, %v; want %q, %v, %v", c.reply, a, correct, stated, c.answer, c.correct, c.stated)
		}
	}
}

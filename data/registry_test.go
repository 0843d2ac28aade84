package data

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestKnown(t *testing.T) {
	want := []string{"nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"}
	if got := Known(); !reflect.DeepEqual(got, want) {
		t.Errorf("Known() = %v, want %v (the papers' table order; reports and configs rely on it)", got, want)
	}
}

func TestSplit(t *testing.T) {
	tests := []struct {
		name string
		want []string
	}{
		{"id", []string{"nq", "hotpotqa"}},
		{"ood", []string{"triviaqa", "popqa", "2wiki", "musique", "bamboogle"}},
		{"all", []string{"nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Split(tt.name)
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Split(%q) = %v, %v; want %v (ReCal's in-domain/out-of-domain protocol)", tt.name, got, err, tt.want)
			}
		})
	}
	_, err := Split("dev")
	if !errors.Is(err, ErrUnknownSplit) || !strings.Contains(err.Error(), "id, ood, all") {
		t.Errorf("Split(\"dev\") error = %v; want ErrUnknownSplit listing id, ood, all", err)
	}
}

func TestLookup(t *testing.T) {
	tests := []struct {
		name               string
		want               string
		inDomain, multiHop bool
	}{
		{"nq", "nq", true, false},
		{"NQ", "nq", true, false},
		{" triviaqa ", "triviaqa", false, false},
		{"popqa", "popqa", false, false},
		{"hotpotqa", "hotpotqa", true, true},
		{"hotpot_qa", "hotpotqa", true, true},
		{"2wiki", "2wiki", false, true},
		{"2wikimultihopqa", "2wiki", false, true}, // FlashRAG's and Search-R1's name
		{"musique", "musique", false, true},
		{"bamboogle", "bamboogle", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical(tt.name)
			if err != nil || got != tt.want {
				t.Fatalf("Canonical(%q) = %q, %v; want %q", tt.name, got, err, tt.want)
			}
			if IsInDomain(tt.name) != tt.inDomain {
				t.Errorf("IsInDomain(%q) = %v, want %v", tt.name, !tt.inDomain, tt.inDomain)
			}
			if IsMultiHop(tt.name) != tt.multiHop {
				t.Errorf("IsMultiHop(%q) = %v, want %v (simulators pick hop counts from it)", tt.name, !tt.multiHop, tt.multiHop)
			}
		})
	}
}

func TestLookupUnknown(t *testing.T) {
	_, err := Lookup("squad")
	if !errors.Is(err, ErrUnknownDataset) {
		t.Fatalf("Lookup(\"squad\") error = %v; want ErrUnknownDataset", err)
	}
	want := `data: unknown dataset "squad" (known: nq, triviaqa, popqa, hotpotqa, 2wiki, musique, bamboogle)`
	if err.Error() != want {
		t.Errorf("error = %q\nwant %q (the message must list the known names)", err, want)
	}
	if IsInDomain("squad") || IsMultiHop("squad") {
		t.Error("an unknown dataset must be neither in-domain nor multi-hop")
	}
}

func TestExpand(t *testing.T) {
	tests := []struct {
		in      []string
		want    []string
		wantErr bool
	}{
		{[]string{"nq", "hotpotqa"}, []string{"nq", "hotpotqa"}, false},
		{[]string{"id", "popqa", "nq"}, []string{"nq", "hotpotqa", "popqa"}, false},
		{[]string{"2wikimultihopqa", "2wiki"}, []string{"2wiki"}, false},
		{[]string{"ood"}, []string{"triviaqa", "popqa", "2wiki", "musique", "bamboogle"}, false},
		{nil, nil, false},
		{[]string{"nq", "squad"}, nil, true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.in, ","), func(t *testing.T) {
			got, err := Expand(tt.in)
			if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Expand(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

package data

import (
	"fmt"
	"strings"
)

// Info describes one dataset of the registry.
type Info struct {
	Name     string // canonical name, e.g. "2wiki"
	InDomain bool   // in the training domain (split "id"); the rest are out of domain ("ood")
	MultiHop bool   // questions need several retrieval hops (HotpotQA-style) rather than one fact
}

// registry lists the seven QA datasets of the ReCal and Router-R1 papers, in
// the order the papers' tables use.
var registry = []Info{
	{Name: "nq", InDomain: true},
	{Name: "triviaqa"},
	{Name: "popqa"},
	{Name: "hotpotqa", InDomain: true, MultiHop: true},
	{Name: "2wiki", MultiHop: true},
	{Name: "musique", MultiHop: true},
	{Name: "bamboogle", MultiHop: true},
}

// aliases maps other spellings used by published files to canonical names.
// FlashRAG and Search-R1 call 2WikiMultihopQA "2wikimultihopqa"; Hugging Face
// hub names use underscores.
var aliases = map[string]string{
	"natural_questions": "nq",
	"nq_open":           "nq",
	"trivia_qa":         "triviaqa",
	"hotpot_qa":         "hotpotqa",
	"2wikimultihopqa":   "2wiki",
	"2wikimultihop_qa":  "2wiki",
	"2wikimqa":          "2wiki",
}

// Split names accepted by Split and Expand.
const (
	SplitInDomain    = "id"  // the training domain: nq, hotpotqa
	SplitOutOfDomain = "ood" // the held-out domains: triviaqa, popqa, 2wiki, musique, bamboogle
	SplitAll         = "all" // every dataset
)

// Known returns the canonical dataset names in registry order.
func Known() []string {
	names := make([]string, len(registry))
	for i, d := range registry {
		names[i] = d.Name
	}
	return names
}

// Lookup returns the registry entry for name, which may be an alias such as
// "2wikimultihopqa". Case and surrounding spaces are ignored. An unknown name
// gives an error wrapping ErrUnknownDataset that lists the known names.
func Lookup(name string) (Info, error) {
	d, err := lookup(name)
	if err != nil {
		return Info{}, fmt.Errorf("data: %w", err)
	}
	return d, nil
}

// lookup is Lookup with errors for wrapping (no package prefix).
func lookup(name string) (Info, error) {
	key := strings.ToLower(strings.TrimSpace(name))
	if canon, ok := aliases[key]; ok {
		key = canon
	}
	for _, d := range registry {
		if d.Name == key {
			return d, nil
		}
	}
	return Info{}, fmt.Errorf("%w %q (known: %s)", ErrUnknownDataset, name, strings.Join(Known(), ", "))
}

// Canonical returns the canonical name of a dataset name or alias.
func Canonical(name string) (string, error) {
	d, err := Lookup(name)
	return d.Name, err
}

func canonical(name string) (string, error) {
	d, err := lookup(name)
	return d.Name, err
}

// Split returns the datasets of a split: "id" (nq, hotpotqa), "ood"
// (triviaqa, popqa, 2wiki, musique, bamboogle) or "all", in registry order.
func Split(name string) ([]string, error) {
	out, err := split(name)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	return out, nil
}

func split(name string) ([]string, error) {
	var out []string
	for _, d := range registry {
		switch name {
		case SplitAll:
			out = append(out, d.Name)
		case SplitInDomain:
			if d.InDomain {
				out = append(out, d.Name)
			}
		case SplitOutOfDomain:
			if !d.InDomain {
				out = append(out, d.Name)
			}
		default:
			return nil, fmt.Errorf("%w %q (known: %s, %s, %s)", ErrUnknownSplit, name, SplitInDomain, SplitOutOfDomain, SplitAll)
		}
	}
	return out, nil
}

// Expand turns a list of dataset names, aliases and split names into
// canonical dataset names, in the order first named, without repeats.
// Expand([]string{"id", "popqa", "nq"}) is [nq hotpotqa popqa].
func Expand(names []string) ([]string, error) {
	out, err := expand(names)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	return out, nil
}

func expand(names []string) ([]string, error) {
	var out []string
	seen := make(map[string]bool)
	add := func(ds string) {
		if !seen[ds] {
			seen[ds] = true
			out = append(out, ds)
		}
	}
	for _, name := range names {
		if members, err := split(name); err == nil {
			for _, ds := range members {
				add(ds)
			}
			continue
		}
		ds, err := canonical(name)
		if err != nil {
			return nil, err
		}
		add(ds)
	}
	return out, nil
}

// IsInDomain reports whether ds (a name or alias) is in the training domain.
// Unknown names are not.
func IsInDomain(ds string) bool {
	d, err := lookup(ds)
	return err == nil && d.InDomain
}

// IsMultiHop reports whether ds (a name or alias) is a multi-hop dataset
// (hotpotqa, 2wiki, musique, bamboogle). nq, triviaqa and popqa are
// single-hop; unknown names report false.
func IsMultiHop(ds string) bool {
	d, err := lookup(ds)
	return err == nil && d.MultiHop
}

package outcomes

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/internal/inputfile"
)

// EVOUNASystems are the QA systems of EVOUNA, in the order of its files. They
// are the model names of the converted log.
var EVOUNASystems = []string{"fid", "gpt35", "chatgpt", "gpt4", "newbing"}

// evounaFiles maps EVOUNA's files to the dataset names of package data.
var evounaFiles = []struct{ file, dataset string }{
	{"NQ.json", "nq"},
	{"TQ.json", "triviaqa"},
}

// EVOUNAJudge is the Judge of every converted row.
const EVOUNAJudge = "human (EVOUNA)"

// Files written by ConvertEVOUNA into its output folder.
const (
	LogFile    = "outcomes.jsonl.gz" // the outcome log, gzipped
	ReportFile = "conversion.json"   // the EVOUNAReport, as JSON
)

// EVOUNAOptions tunes ConvertEVOUNA.
type EVOUNAOptions struct {
	// InDomain is the dataset split into training and test questions; the
	// others are test only. Default "nq".
	InDomain string
	// Test is the number of InDomain questions written to its test file,
	// drawn with Seed; the rest are its training file (package data holds
	// validation questions out of that). Default 1000.
	Test int
	// Seed changes which questions are drawn for the test file.
	Seed int64
}

// EVOUNAReport counts what ConvertEVOUNA read and wrote, per dataset.
type EVOUNAReport struct {
	Datasets []DatasetReport `json:"datasets"`
}

// DatasetReport counts one EVOUNA file.
type DatasetReport struct {
	Dataset string `json:"dataset"`
	File    string `json:"file"`
	// Records are the file's records; Improper those flagged improper by
	// EVOUNA's authors; NoGolden those without a golden answer (left out).
	Records  int `json:"records"`
	Improper int `json:"improper"`
	NoGolden int `json:"no_golden"`
	// Usable counts, per system, the records not improper, with a golden
	// answer and with the system's judgment present.
	Usable map[string]int `json:"usable"`
	// Right counts, per system, the usable records judged right.
	Right map[string]int `json:"right"`
	// Complete counts the records usable for every system: the questions
	// written to the question files.
	Complete int `json:"complete"`
	// Rows are the log rows written (a record and system with a reply or a
	// judgment, and a golden answer; improper records included).
	Rows int `json:"rows"`
	// Train and Test are the questions written to the training and test
	// files.
	Train int `json:"train"`
	Test  int `json:"test"`
}

// evounaRecord is one EVOUNA record as read, with each system's fields.
type evounaRecord struct {
	question string
	golden   []string
	improper bool
	answer   map[string]*string
	judge    map[string]*bool
}

// ConvertEVOUNA reads EVOUNA's NQ.json and TQ.json from src and writes into
// out: the outcome log LogFile (one row per record and system that has a
// reply or a judgment; question ids "nq/evouna-<index>" and
// "triviaqa/evouna-<index>", index 0-based in the file), and the question
// files package data reads: <dataset>/test.jsonl for every dataset and
// <InDomain>/train.jsonl, holding the complete questions only (not
// improper, golden answer present, every system judged). It copies src's
// LICENSE and writes ReportFile (the report it returns) and README.md
// (src's README.md and the counts).
func ConvertEVOUNA(src, out string, o EVOUNAOptions) (EVOUNAReport, error) {
	if o.InDomain == "" {
		o.InDomain = "nq"
	}
	if o.Test == 0 {
		o.Test = 1000
	}
	if o.Test < 0 {
		return EVOUNAReport{}, fmt.Errorf("outcomes: evouna: test questions %d, want > 0", o.Test)
	}
	known := false
	for _, f := range evounaFiles {
		known = known || f.dataset == o.InDomain
	}
	if !known {
		return EVOUNAReport{}, fmt.Errorf("outcomes: evouna: in-domain dataset %q is not one of nq, triviaqa", o.InDomain)
	}
	var rep EVOUNAReport
	var rows []Row
	questions := map[string][]question{} // file split "<dataset>/<split>" → questions
	for _, f := range evounaFiles {
		path := filepath.Join(src, f.file)
		recs, err := readEVOUNA(path)
		if err != nil {
			return rep, err
		}
		dr := DatasetReport{Dataset: f.dataset, File: f.file, Records: len(recs), Usable: map[string]int{}, Right: map[string]int{}}
		var complete []question
		for i, rec := range recs {
			id := fmt.Sprintf("%s/evouna-%d", f.dataset, i)
			if rec.improper {
				dr.Improper++
			}
			if len(rec.golden) == 0 {
				dr.NoGolden++
				continue
			}
			all := !rec.improper
			for _, s := range EVOUNASystems {
				a, j := rec.answer[s], rec.judge[s]
				if a != nil || j != nil {
					rows = append(rows, Row{Dataset: f.dataset, QuestionID: id, Question: rec.question, Golden: rec.golden,
						Model: s, Reply: a, Correct: j, Judge: judgeOf(j)})
					dr.Rows++
				}
				if !rec.improper && j != nil {
					dr.Usable[s]++
					if *j {
						dr.Right[s]++
					}
				}
				all = all && j != nil
			}
			if all {
				complete = append(complete, question{ID: strings.TrimPrefix(id, f.dataset+"/"), Question: rec.question, Golden: rec.golden, Dataset: f.dataset})
			}
		}
		dr.Complete = len(complete)
		if f.dataset == o.InDomain {
			if o.Test >= len(complete) {
				return rep, fmt.Errorf("outcomes: evouna: %d test questions of %d complete %s questions leave none to train on", o.Test, len(complete), f.dataset)
			}
			test, train := drawTest(complete, o.Test, o.Seed)
			questions[f.dataset+"/train"], questions[f.dataset+"/test"] = train, test
			dr.Train, dr.Test = len(train), len(test)
		} else {
			questions[f.dataset+"/test"] = complete
			dr.Test = len(complete)
		}
		rep.Datasets = append(rep.Datasets, dr)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return rep, fmt.Errorf("outcomes: %w", err)
	}
	if err := WriteFile(filepath.Join(out, LogFile), rows); err != nil {
		return rep, err
	}
	for _, k := range slices.Sorted(maps.Keys(questions)) {
		if err := writeQuestions(filepath.Join(out, k+".jsonl"), questions[k]); err != nil {
			return rep, err
		}
	}
	if err := writeFile(filepath.Join(out, ReportFile), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}); err != nil {
		return rep, err
	}
	if err := copyFile(filepath.Join(src, "LICENSE"), filepath.Join(out, "LICENSE")); err != nil {
		return rep, err
	}
	readme, err := inputfile.ReadFile(filepath.Join(src, "README.md"), inputfile.ConfigLimit)
	if err != nil {
		return rep, fmt.Errorf("outcomes: evouna: %w (the source's README.md names where the data comes from)", err)
	}
	if err := writeFile(filepath.Join(out, "README.md"), func(w io.Writer) error {
		_, err := io.WriteString(w, evounaReadme(readme, rep, o))
		return err
	}); err != nil {
		return rep, err
	}
	return rep, nil
}

func judgeOf(j *bool) string {
	if j == nil {
		return ""
	}
	return EVOUNAJudge
}

// drawTest draws n questions for the test file: those with the n smallest
// SHA-256 of (seed, id), each set kept in file order.
func drawTest(qs []question, n int, seed int64) (test, train []question) {
	rank := make([]uint64, len(qs))
	for i, q := range qs {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(seed))
		h := sha256.Sum256(append(b[:], q.ID...))
		rank[i] = binary.BigEndian.Uint64(h[:8])
	}
	order := make([]int, len(qs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case rank[a] < rank[b]:
			return -1
		case rank[a] > rank[b]:
			return 1
		}
		return a - b
	})
	inTest := make([]bool, len(qs))
	for _, i := range order[:n] {
		inTest[i] = true
	}
	for i, q := range qs {
		if inTest[i] {
			test = append(test, q)
		} else {
			train = append(train, q)
		}
	}
	return test, train
}

// readEVOUNA reads one EVOUNA file strictly: a JSON array of records with
// only EVOUNA's fields; a judgment is true, false, null or the string "nan"
// (missing); an answer or the golden answer is a string or null.
func readEVOUNA(path string) ([]evounaRecord, error) {
	b, err := inputfile.ReadFile(path, inputfile.TextLimit)
	if err != nil {
		return nil, fmt.Errorf("outcomes: evouna: %w", err)
	}
	var raws []map[string]json.RawMessage
	if err := json.Unmarshal(b, &raws); err != nil {
		return nil, fmt.Errorf("outcomes: evouna: %s: want a JSON array of records: %v", path, jsonMessage(err))
	}
	out := make([]evounaRecord, len(raws))
	for i, raw := range raws {
		rec, err := parseEVOUNA(raw)
		if err != nil {
			return nil, fmt.Errorf("outcomes: evouna: %s: record %d: %w", path, i, err)
		}
		out[i] = rec
	}
	return out, nil
}

func parseEVOUNA(raw map[string]json.RawMessage) (evounaRecord, error) {
	rec := evounaRecord{answer: map[string]*string{}, judge: map[string]*bool{}}
	fields := map[string]bool{"question": true, "golden_answer": true, "improper": true}
	for _, s := range EVOUNASystems {
		fields["answer_"+s], fields["judge_"+s] = true, true
	}
	for k := range raw {
		if !fields[k] {
			return rec, fmt.Errorf("unknown field %q", cut(k))
		}
	}
	str := func(k string) (*string, error) {
		v, ok := raw[k]
		if !ok || bytes.Equal(v, []byte("null")) {
			return nil, nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf("field %q: want a string or null", k)
		}
		return &s, nil
	}
	q, err := str("question")
	if err != nil {
		return rec, err
	}
	if q == nil || strings.TrimSpace(*q) == "" {
		return rec, errors.New(`field "question" is missing or empty`)
	}
	rec.question = *q
	g, err := str("golden_answer")
	if err != nil {
		return rec, err
	}
	if g != nil {
		for _, a := range strings.Split(*g, "/") {
			if a = strings.TrimSpace(a); a != "" {
				rec.golden = append(rec.golden, a)
			}
		}
	}
	if v, ok := raw["improper"]; ok && !bytes.Equal(v, []byte("null")) {
		if err := json.Unmarshal(v, &rec.improper); err != nil {
			return rec, errors.New(`field "improper": want true or false`)
		}
	}
	for _, s := range EVOUNASystems {
		if rec.answer[s], err = str("answer_" + s); err != nil {
			return rec, err
		}
		v, ok := raw["judge_"+s]
		if !ok || bytes.Equal(v, []byte("null")) || bytes.Equal(v, []byte(`"nan"`)) {
			continue
		}
		var j bool
		if err := json.Unmarshal(v, &j); err != nil {
			return rec, fmt.Errorf("field %q: want true, false, null or \"nan\"", "judge_"+s)
		}
		rec.judge[s] = &j
	}
	return rec, nil
}

// evounaReadme is the README.md of a converted folder: the source's README
// and the converter's counts.
func evounaReadme(source []byte, rep EVOUNAReport, o EVOUNAOptions) string {
	var b strings.Builder
	b.WriteString("<!-- Written by `recal outcomes convert-evouna`; do not edit. -->\n")
	b.WriteString("# EVOUNA as a recal outcome log\n\n")
	b.WriteString("Made with `recal outcomes convert-evouna`")
	fmt.Fprintf(&b, " (in-domain %s, %d test questions, seed %d) from the files described below ", o.InDomain, o.Test, o.Seed)
	b.WriteString("\n(licence: `LICENSE`, Apache-2.0, copied from the source). The format and the replay\n")
	b.WriteString("provider are described in docs/outcomes.md.\n\n")
	b.WriteString("- `outcomes.jsonl.gz`: the outcome log (gzipped; `zcat` reads it), one row per record and system with a reply or a judgment (improper records included).\n")
	b.WriteString("- `<dataset>/{train,test}.jsonl`: the complete questions (not improper, golden answer present, all five systems judged).\n")
	b.WriteString("- `conversion.json`: the counts below, as the converter reported them.\n\n")
	b.WriteString("| dataset | file | records | improper | no golden | rows | complete | train | test |")
	for _, s := range EVOUNASystems {
		fmt.Fprintf(&b, " usable %s (right) |", s)
	}
	b.WriteString("\n|---|---|---|---|---|---|---|---|---|")
	for range EVOUNASystems {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, d := range rep.Datasets {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d |", d.Dataset, d.File, d.Records, d.Improper, d.NoGolden, d.Rows, d.Complete, d.Train, d.Test)
		for _, s := range EVOUNASystems {
			fmt.Fprintf(&b, " %d (%.3f) |", d.Usable[s], float64(d.Right[s])/float64(max(d.Usable[s], 1)))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n\"usable\": not improper, golden answer present, the system's judgment present; \"right\": the share of those judged right.\n\n")
	b.WriteString("## Source (its README, as copied)\n\n")
	src := strings.TrimSpace(string(source))
	src = strings.Replace(src, "# ", "### ", 1)
	b.WriteString(src)
	b.WriteString("\n")
	return b.String()
}

package policyinit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The vocabulary a trimmed tokenizer keeps comes from a TOML file's string
// values only: a comment edit must not change it.
func TestTrimCorpusTOML(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("pool.toml", "# zebracomment\nseed = 3\n[[pool.models]]\nname = \"sim-quokka\"\ndescription = \"good at walruses\" # trailing remark\ntags = [\"otter\", 4]\n")
	corpus, err := trimCorpus([]string{good})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(corpus, "\n")
	for _, want := range []string{"sim-quokka", "good at walruses", "otter"} {
		if !strings.Contains(text, want) {
			t.Errorf("corpus lacks the string value %q", want)
		}
	}
	for _, not := range []string{"zebracomment", "trailing remark"} {
		if strings.Contains(text, not) {
			t.Errorf("corpus holds the comment text %q", not)
		}
	}
	bad := write("bad.toml", "name = \"unterminated\n")
	if _, err := trimCorpus([]string{bad}); err == nil || !strings.Contains(err.Error(), "bad.toml") {
		t.Errorf("bad TOML: error %v, want one naming bad.toml", err)
	}
}

package docgen

import (
	"strings"
	"testing"

	"github.com/urfave/cli/v3"
)

// TestCLIMarkdown checks each part of a command's section: a reader of
// docs/cli.md must find every visible command and flag as --help shows it.
func TestCLIMarkdown(t *testing.T) {
	app := &cli.Command{
		Name:        "tool",
		Usage:       "do <things>",
		Description: "Long text\nover two lines.",
		Flags:       []cli.Flag{&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Value: 4, Usage: "CPU threads"}},
		Commands: []*cli.Command{
			{Name: "run", Usage: "run it", ArgsUsage: "DIR", Flags: []cli.Flag{
				&cli.StringFlag{Name: "out", Value: "a|b", Usage: "output folder", Required: true},
				&cli.StringSliceFlag{Name: "set", Usage: "override a key"},
				&cli.BoolFlag{Name: "dry-run", Usage: "check only"},
				&cli.StringFlag{Name: "secret", Hidden: true},
			}},
			{Name: "group", Usage: "a group", Commands: []*cli.Command{{Name: "leaf", Usage: "the leaf"}}},
			{Name: "ghost", Usage: "hidden", Hidden: true},
		},
	}
	page := string(CLIMarkdown(app, "make docs"))
	for _, tc := range []struct{ name, want string }{
		{"usage is escaped", "do \\<things\\>"},
		{"description verbatim", "```text\nLong text\nover two lines.\n```"},
		{"global flag with alias and default", "| `--threads`, `-t` | int | `4` | CPU threads |"},
		{"synopsis with arguments", "```text\ntool run [options] DIR\n```"},
		{"required flag, | escaped", "| `--out` | string | `\"a\\|b\"` | output folder (required) |"},
		{"repeatable flag", "| `--set` | string (repeatable) |  | override a key |"},
		{"switch", "| `--dry-run` | switch | `false` | check only |"},
		{"sub-command section", "### `tool group leaf`\n\nthe leaf\n\n```text\ntool group leaf\n```"},
		{"contents, nested", "- [`tool group`](#tool-group): a group\n  - [`tool group leaf`](#tool-group-leaf): the leaf"},
		{"regeneration command", "`make docs` rewrites it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(page, tc.want) {
				t.Errorf("the page lacks\n%s\n\npage:\n%s", tc.want, page)
			}
		})
	}
	for _, hidden := range []string{"secret", "ghost"} {
		if strings.Contains(page, hidden) {
			t.Errorf("hidden %q is on the page; --help does not show it", hidden)
		}
	}
	// The command tree is only read: running it afterwards still works.
	if strings.Contains(page, "--help`,") || strings.Contains(page, "`tool help`") {
		t.Errorf("the page lists urfave/cli's own help command or flag:\n%s", page)
	}
}

package docgen

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v3"
)

// CLIMarkdown renders docs/cli.md from the command tree app as built (not
// run: urfave/cli adds its help command and --help flag only when it runs):
// every visible command and sub-command in the order the tree declares them,
// each with its usage line, one-line usage, description and flags (names,
// type, default, usage text). regenerate is the command that rewrites the
// page.
func CLIMarkdown(app *cli.Command, regenerate string) []byte {
	var blocks []string
	add := func(format string, args ...any) { blocks = append(blocks, fmt.Sprintf(format, args...)) }
	add("# Command reference")
	add("<!-- Generated from the code by `%s`. Do not edit. -->", regenerate)
	add("Every command of `%s`, generated from the command tree whose help `%s COMMAND --help` prints. "+
		"Global options go before the command; every command also takes `--help` (`-h`). "+
		"A test fails when this page is stale; `%s` rewrites it.", app.Name, app.Name, regenerate)
	add("## Commands")
	var toc []string
	var list func(c *cli.Command, path string, depth int)
	list = func(c *cli.Command, path string, depth int) {
		for _, sub := range visible(c.Commands) {
			name := path + " " + sub.Name
			toc = append(toc, strings.Repeat("  ", depth)+commandLink(name, sub))
			list(sub, name, depth+1)
		}
	}
	list(app, app.Name, 0)
	add("%s", strings.Join(toc, "\n"))
	blocks = appendCommand(blocks, app, app.Name, 0)
	return []byte(strings.Join(blocks, "\n\n") + "\n")
}

// commandLink is a list item linking to a command's section.
func commandLink(name string, c *cli.Command) string {
	h := "`" + name + "`"
	return fmt.Sprintf("- [%s](#%s): %s", h, slug(h), escape(c.Usage))
}

// visible returns the commands that are not hidden.
func visible(cmds []*cli.Command) []*cli.Command {
	var out []*cli.Command
	for _, c := range cmds {
		if !c.Hidden {
			out = append(out, c)
		}
	}
	return out
}

// appendCommand adds one command's section, then its sub-commands'.
func appendCommand(blocks []string, c *cli.Command, name string, depth int) []string {
	add := func(format string, args ...any) { blocks = append(blocks, fmt.Sprintf(format, args...)) }
	add("%s `%s`", strings.Repeat("#", min(2+max(depth-1, 0), 4)), name)
	if c.Usage != "" {
		add("%s", escape(c.Usage))
	}
	add("```text\n%s\n```", usageLine(c, name, depth))
	if d := strings.TrimSpace(c.Description); d != "" {
		add("```text\n%s\n```", d)
	}
	if len(c.Aliases) > 0 {
		add("Aliases: %s", code(strings.Join(c.Aliases, ", ")))
	}
	if rows := flagRows(c.Flags); len(rows) > 0 {
		label := "Options:"
		if depth == 0 {
			label = "Global options:"
		}
		lines := []string{"| option | type | default | usage |", "| --- | --- | --- | --- |"}
		for _, r := range rows {
			lines = append(lines, "| "+strings.Join(r, " | ")+" |")
		}
		add("%s", label)
		add("%s", strings.Join(lines, "\n"))
	}
	subs := visible(c.Commands)
	if len(subs) > 0 {
		var items []string
		for _, s := range subs {
			items = append(items, commandLink(name+" "+s.Name, s))
		}
		add("Commands:")
		add("%s", strings.Join(items, "\n"))
	}
	for _, s := range subs {
		blocks = appendCommand(blocks, s, name+" "+s.Name, depth+1)
	}
	return blocks
}

// usageLine is the synopsis: the command's UsageText, else its name,
// options, sub-command and arguments.
func usageLine(c *cli.Command, name string, depth int) string {
	if c.UsageText != "" {
		return strings.TrimSpace(c.UsageText)
	}
	s := name
	if len(flagRows(c.Flags)) > 0 {
		if depth == 0 {
			s += " [global options]"
		} else {
			s += " [options]"
		}
	}
	if len(visible(c.Commands)) > 0 {
		s += " COMMAND [options]"
	}
	if a := strings.TrimSpace(c.ArgsUsage); a != "" {
		s += " " + a
	}
	return s
}

// flagRows are the cells of the visible flags: names, type ("switch" for a
// flag that takes no value, "(repeatable)" for one given several times),
// default and usage (marked when required or deprecated).
func flagRows(flags []cli.Flag) [][]string {
	var rows [][]string
	for _, f := range flags {
		if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		var names []string
		for _, n := range f.Names() {
			if len([]rune(n)) == 1 {
				names = append(names, code("-"+n))
			} else {
				names = append(names, code("--"+n))
			}
		}
		typ, def, usage := "", "", ""
		if d, ok := f.(cli.DocGenerationFlag); ok {
			usage = d.GetUsage()
			typ = "switch"
			if d.TakesValue() {
				typ = d.TypeName()
			}
			if d.IsDefaultVisible() {
				if def = d.GetDefaultText(); def == "" {
					def = d.GetValue()
				}
			}
		}
		if m, ok := f.(cli.DocGenerationMultiValueFlag); ok && m.IsMultiValueFlag() {
			typ += " (repeatable)"
		}
		var marks []string
		if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() {
			marks = append(marks, "required")
		}
		if d, ok := f.(cli.DeprecatedFlag); ok && d.GetDeprecated() != "" {
			marks = append(marks, "deprecated: "+d.GetDeprecated())
		}
		usage = escape(usage)
		if len(marks) > 0 {
			usage = strings.TrimSpace(usage + " (" + escape(strings.Join(marks, "; ")) + ")")
		}
		if def != "" {
			def = code(def)
		}
		rows = append(rows, []string{strings.Join(names, ", "), escape(typ), def, usage})
	}
	return rows
}

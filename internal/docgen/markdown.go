package docgen

import (
	"go/doc/comment"
	"strings"
)

// markdown renders a Go doc comment as Markdown.
func markdown(text string) string {
	var p comment.Parser
	pr := comment.Printer{HeadingLevel: 4}
	return strings.TrimSpace(string(pr.Markdown(p.Parse(text))))
}

// code renders s as a Markdown code span fit for a table cell.
func code(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}

// escape makes plain text safe in Markdown (table cells included).
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune("\\`*_[]<>|", r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// slug is GitHub's anchor for a heading.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

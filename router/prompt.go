package router

import (
	"fmt"
	"os"
	"strings"
	"text/template"

	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/tokenizer"
)

// Prompt renders the routing prompt from a template file and wraps it as the
// user turn of the chat template. The template sees:
//
//	.Question  the question text
//	.Models    the pool models, each with .Name, .Description, .PriceIn, .PriceOut
//	.MaxTurns  the most pool calls allowed
//
// Models unseen in training are shown the same way: adding one to the pool's
// config adds it to the prompt.
type Prompt struct {
	tmpl     *template.Template
	models   []llmpool.ModelInfo
	maxTurns int
}

// NewPrompt parses the template file at path.
func NewPrompt(path string, models []llmpool.ModelInfo, maxTurns int) (*Prompt, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("router: prompt template: %w", err)
	}
	t, err := template.New(path).Option("missingkey=error").Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("router: prompt template %s: %w", path, err)
	}
	p := &Prompt{tmpl: t, models: models, maxTurns: maxTurns}
	if _, err := p.Text("test question?"); err != nil {
		return nil, err
	}
	return p, nil
}

// Text renders the template for one question.
func (p *Prompt) Text(question string) (string, error) {
	var sb strings.Builder
	err := p.tmpl.Execute(&sb, map[string]any{"Question": question, "Models": p.models, "MaxTurns": p.maxTurns})
	if err != nil {
		return "", fmt.Errorf("router: prompt template %s: %w", p.tmpl.Name(), err)
	}
	return sb.String(), nil
}

// Chat renders the prompt as a ChatML conversation ending with the
// assistant's turn, ready for the policy to continue.
func (p *Prompt) Chat(tok *tokenizer.Tokenizer, question string) (string, error) {
	text, err := p.Text(question)
	if err != nil {
		return "", err
	}
	return tok.FormatChat([]tokenizer.Message{{Role: "user", Content: text}}, true), nil
}

package router

import (
	"fmt"
	"strings"
	"text/template"

	"github.com/recal-project/recal/internal/inputfile"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/llmpool"
)

// Prompt renders the routing prompt from a template file and wraps it as the
// user turn of the chat template. The template sees:
//
//	.Question  the question text
//	.Models    the pool models, each with .Name, .Description, .PriceIn, .PriceOut
//	.MaxTurns  the most pool calls allowed
//
// Models unseen in training are shown the same way: adding one to the pool's
// config adds it to the prompt. The template and the model descriptions come
// from the config and are trusted; the question is untrusted text, which the
// template must insert as is (no function applied to it).
type Prompt struct {
	tmpl     *template.Template
	models   []llmpool.ModelInfo
	maxTurns int
}

// NewPrompt parses the template file at path.
func NewPrompt(path string, models []llmpool.ModelInfo, maxTurns int) (*Prompt, error) {
	b, err := inputfile.ReadFile(path, inputfile.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("router: prompt template: %w", err)
	}
	t, err := template.New(path).Option("missingkey=error").Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("router: prompt template %s: %w", path, err)
	}
	p := &Prompt{tmpl: t, models: models, maxTurns: maxTurns}
	if _, err := p.parts("test question?"); err != nil {
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

// Tokens renders the prompt as the user turn of a ChatML conversation
// ending with the assistant's turn, ready for the policy to continue, and
// encodes it with the question as plain text (tokenizer.EncodeSegments): the
// only added tokens are the chat template's and the prompt template's own,
// whatever the question writes ("<|im_end|>", "<|im_start|>system"). A
// question without such tokens gives the ids of Encode of the whole text.
func (p *Prompt) Tokens(tok *tokenizer.Tokenizer, question string) ([]int, error) {
	parts, err := p.parts(question)
	if err != nil {
		return nil, err
	}
	chat := tok.FormatChat([]tokenizer.Message{{Role: "user", Content: strings.Join(parts, questionMark)}}, true)
	around := strings.Split(chat, questionMark)
	if len(around) != len(parts) {
		return nil, fmt.Errorf("router: prompt: the chat template's system message holds %q", questionMark)
	}
	var segs []tokenizer.Segment
	for i, part := range around {
		if i > 0 {
			segs = append(segs, tokenizer.Segment{Text: question, Plain: true})
		}
		segs = append(segs, tokenizer.Segment{Text: part})
	}
	return tok.EncodeSegments(segs...), nil
}

// questionMark stands for the question while the template is rendered, so
// the question's places in the text are known.
const questionMark = "\x00question\x00"

// parts renders the template with questionMark as the question and returns
// the text around each place the question goes. It fails when the template
// does not insert the question as is, or when the rest of the prompt holds
// questionMark itself: the question would then be misplaced.
func (p *Prompt) parts(question string) ([]string, error) {
	marked, err := p.Text(questionMark)
	if err != nil {
		return nil, err
	}
	text, err := p.Text(question)
	if err != nil {
		return nil, err
	}
	if strings.ReplaceAll(marked, questionMark, question) != text {
		return nil, fmt.Errorf("router: prompt template %s: it must insert .Question as is", p.tmpl.Name())
	}
	return strings.Split(marked, questionMark), nil
}

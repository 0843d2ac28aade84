package tokenizer

import "strings"

// Message is one turn of a conversation. Role is "system", "user",
// "assistant" or "tool".
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// DefaultSystem is the system message FormatChat inserts when the first
// message is not a system message. It is read from the chat_template of
// tokenizer_config.json: for Qwen2.5, "You are Qwen, created by Alibaba
// Cloud. You are a helpful assistant.". Without a config file it is that same
// Qwen2.5 message; with a template that has no default system block (e.g.
// Qwen3's) it is "", and none is inserted.
func (t *Tokenizer) DefaultSystem() string { return t.defaultSystem }

// FormatChat renders msgs with Qwen2.5's ChatML chat template (the branch
// without tools), as tokenizer.apply_chat_template(msgs, tokenize=False,
// add_generation_prompt=...) does:
//
//	<|im_start|>system\n{system}<|im_end|>\n
//	<|im_start|>user\n{content}<|im_end|>\n
//	<|im_start|>assistant\n{content}<|im_end|>\n
//	...
//	<|im_start|>assistant\n               (when addGenerationPrompt)
//
// The system block comes from the first message when its role is "system",
// otherwise it holds DefaultSystem. A later system message is rendered in
// place like a user one. Consecutive "tool" messages are wrapped together in
// one user turn, each as "\n<tool_response>\n{content}\n</tool_response>".
// Like the template, messages with any other role produce nothing. The
// template itself is not interpreted; FormatChat is Go code equal to it.
// Content is not escaped: special tokens written in it are kept and Encode
// turns them into their ids, as Hugging Face does.
func (t *Tokenizer) FormatChat(msgs []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	if len(msgs) > 0 && msgs[0].Role == "system" {
		b.WriteString("<|im_start|>system\n" + msgs[0].Content + "<|im_end|>\n")
	} else if t.defaultSystem != "" {
		b.WriteString("<|im_start|>system\n" + t.defaultSystem + "<|im_end|>\n")
	}
	for i, m := range msgs {
		switch {
		case m.Role == "user", m.Role == "system" && i > 0, m.Role == "assistant":
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		case m.Role == "tool":
			if i == 0 || msgs[i-1].Role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + m.Content + "\n</tool_response>")
			if i == len(msgs)-1 || msgs[i+1].Role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

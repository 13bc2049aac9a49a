package pd

import "encoding/json"

// completionAnswer is the part of a whole completion (chat or not) a
// stream carries.
type completionAnswer struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int    `json:"index"`
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
}

// AppendAnswerSSE appends a whole completion answer as the SSE stream an
// OpenAI server would have sent: one chunk per choice with its text and
// finish reason, the usage chunk when the client asked for it, and
// [DONE]. Only answers that end at their first token take this path, so
// it favours clarity over allocations.
func AppendAnswerSSE(dst, body []byte, chat, usage bool) ([]byte, error) {
	var a completionAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return dst, err
	}
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	type delta struct {
		Role    string `json:"role,omitempty"`
		Content string `json:"content"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Text         *string `json:"text,omitempty"`
		Delta        *delta  `json:"delta,omitempty"`
		FinishReason *string `json:"finish_reason"`
	}
	type chunk struct {
		ID      string          `json:"id"`
		Object  string          `json:"object"`
		Created int64           `json:"created"`
		Model   string          `json:"model"`
		Choices []choice        `json:"choices"`
		Usage   json.RawMessage `json:"usage,omitempty"`
	}
	event := func(c chunk) error {
		b, err := json.Marshal(c)
		if err == nil {
			dst = append(append(append(dst, "data: "...), b...), "\n\n"...)
		}
		return err
	}
	for i := range a.Choices {
		ac := &a.Choices[i]
		c := choice{Index: ac.Index, FinishReason: ac.FinishReason}
		if chat {
			c.Delta = &delta{Role: ac.Message.Role, Content: ac.Message.Content}
		} else {
			c.Text = &ac.Text
		}
		if err := event(chunk{ID: a.ID, Object: object, Created: a.Created, Model: a.Model, Choices: []choice{c}}); err != nil {
			return dst, err
		}
	}
	if usage && len(a.Usage) > 0 && string(a.Usage) != "null" {
		if err := event(chunk{ID: a.ID, Object: object, Created: a.Created, Model: a.Model, Choices: []choice{}, Usage: a.Usage}); err != nil {
			return dst, err
		}
	}
	return append(dst, "data: [DONE]\n\n"...), nil
}

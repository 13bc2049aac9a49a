package chat_test

import (
	"errors"
	"fmt"

	"pdlb/engines/chat"
)

// A gateway's use: compile the model's template once, then per request
// parse the body into a pooled Conversation and render the prompt, or
// answer vLLM's 400.
func Example() {
	tmpl, err := chat.Compile(`{% for m in messages %}<|{{ m.role }}|>{{ m.content }}
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}`, map[string]string{"eos_token": "</s>"})
	if err != nil {
		panic(err)
	}
	c := chat.AcquireConversation()
	defer chat.ReleaseConversation(c)
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"bogus"}]}]}`,
	} {
		if err := c.ParseRequest([]byte(body)); err != nil {
			var re *chat.RequestError
			if errors.As(err, &re) {
				fmt.Printf("400 %s\n", re.AppendBody(nil))
			}
			continue
		}
		prompt, err := tmpl.Render(nil, c, nil)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%q\n", prompt)
	}
	// Output:
	// "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
	// 400 {"error":{"message":"Unsupported chat content part type: 'bogus'. Supported types: audio_embeds, audio_url, image_embeds, image_pil, image_url, input_audio, input_image, input_text, output_text, prompt_embeds, refusal, text, thinking, tool_reference, video_url.","type":"BadRequestError","param":"messages[0].content[0].type","code":400}}
}

package chat

import (
	"sync"
	"testing"
)

// TestToolsCacheShared: renders of conversations with the same tools,
// concurrent (go test -race), give what one render alone gives, and a
// different list is not taken for a cached one.
func TestToolsCacheShared(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3")
	defer tmpl.learners.Wait()
	tool := func(name string) string {
		return `{"type":"function","function":{"name":"` + name + `","description":"d","parameters":{"type":"object","properties":{"p":{"type":"string"}}}}}`
	}
	body := func(tools, user string) []byte {
		return []byte(`{"messages":[{"role":"user","content":"` + user + `"}],"tools":[` + tools + `]}`)
	}
	render := func(b []byte) string {
		c := AcquireConversation()
		defer ReleaseConversation(c)
		if err := c.ParseRequest(b); err != nil {
			t.Error(err)
			return ""
		}
		out, err := tmpl.Render(nil, c, nil)
		if err != nil {
			t.Error(err)
		}
		return string(out)
	}
	lists := []string{tool("a"), tool("a") + "," + tool("b"), tool("c")}
	want := map[string]string{}
	for _, l := range lists {
		want[l] = render(body(l, "hi"))
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				l := lists[(g+i)%len(lists)]
				if got := render(body(l, "hi")); got != want[l] {
					t.Errorf("goroutine %d: tools %s rendered\n%q\nwant\n%q", g, l, got, want[l])
					return
				}
			}
		})
	}
	wg.Wait()
	if want[lists[0]] == want[lists[2]] {
		t.Fatal("different tools rendered alike")
	}
}

// TestToolsCacheMutatingTemplate: a template that changes the tools it is
// given (the engine allows list.append) sees a fresh list each render.
func TestToolsCacheMutatingTemplate(t *testing.T) {
	tmpl, err := Compile(`{% set _ = tools.append(tools[0]) %}{{ tools | length }}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c := AcquireConversation()
		if err := c.ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`)); err != nil {
			t.Fatal(err)
		}
		out, err := tmpl.Render(nil, c, nil)
		ReleaseConversation(c)
		if err != nil || string(out) != "2" {
			t.Fatalf("render %d: %q %v, want 2", i, out, err)
		}
	}
}

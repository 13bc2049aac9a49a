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
// given (the engine allows list methods that do, called or taken as
// values, and dotted sets on any dict) sees fresh tools each render; a
// template whose dotted sets are on namespaces keeps them.
func TestToolsCacheMutatingTemplate(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{`{% set _ = tools.append(tools[0]) %}{{ tools | length }}`, "2"},
		{`{% set add = tools.append %}{% set _ = add(tools[0]) %}{{ tools | length }}`, "2"},
		{`{% set _ = (tools.pop)() %}{{ tools | length }}`, "0"},
		{`{% set t0 = tools[0] %}{% set t0.type = t0.type ~ "!" %}{{ t0.type }}`, "function!"},
		{`{% set t0 = tools[0] %}{{ t0 | tojson }}|{% set t0.type = "x" %}{{ t0 | tojson }}`,
			`{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}|{"type": "x", "function": {"name": "f", "description": null, "parameters": null}}`},
	} {
		tmpl, err := Compile(c.src, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			cv := AcquireConversation()
			if err := cv.ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`)); err != nil {
				t.Fatal(err)
			}
			out, err := tmpl.Render(nil, cv, nil)
			ReleaseConversation(cv)
			if err != nil || string(out) != c.want {
				t.Fatalf("%s, render %d: %q %v, want %q", c.src, i, out, err, c.want)
			}
		}
	}
	if mutates(`{%- set ns = namespace(multi_step_tool=true) %}{%- set ns.multi_step_tool = false %}`) {
		t.Error("a namespace's dotted set counts as changing a value")
	}
	if qwen3 := loadTemplate(t, "qwen3"); qwen3.mutates {
		t.Error("Qwen3's template keeps no tools")
	}
}

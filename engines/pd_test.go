package engines

import (
	"errors"
	"testing"
)

func TestEditObject(t *testing.T) {
	f := func(in string, edits []Edit, want string) {
		t.Helper()
		got, err := EditObject([]byte("prefix:"), []byte(in), edits...)
		if err != nil {
			t.Fatalf("EditObject(%s): %v", in, err)
		}
		if string(got) != "prefix:"+want {
			t.Fatalf("EditObject(%s)\n got %s\nwant prefix:%s", in, got, want)
		}
	}
	set := func(k, v string) Edit { return Edit{Key: k, Value: []byte(v)} }
	del := func(k string) Edit { return Edit{Key: k} }
	f(`{"a":1,"stream":true,"b":[1,{"stream":2}]}`, []Edit{set("stream", "false")},
		`{"a":1,"stream":false,"b":[1,{"stream":2}]}`)
	f(`{"a":1}`, []Edit{set("stream", "false")}, `{"a":1,"stream":false}`)
	f(`{}`, []Edit{set("x", "1"), set("y", "2")}, `{"x":1,"y":2}`)
	f(` { } `, []Edit{set("x", "1")}, ` { "x":1} `)
	f(`{"a":1}`, []Edit{del("nope"), {Key: "m", Value: []byte("1"), IfPresent: true}}, `{"a":1}`)
	f(`{"m":5,"a":1}`, []Edit{{Key: "m", Value: []byte("1"), IfPresent: true}}, `{"m":1,"a":1}`)
	// Deleting the first, a middle and the last member keeps the others'
	// bytes and separators.
	f("{\n  \"so\": {\"x\":1},\n  \"a\": \"s,}\",\n  \"b\": 2\n}", []Edit{del("so")}, "{\n  \"a\": \"s,}\",\n  \"b\": 2\n}")
	f(`{"a":1, "so":null, "b":2}`, []Edit{del("so")}, `{"a":1, "b":2}`)
	f(`{"a":1, "b":2, "so":null}`, []Edit{del("so")}, `{"a":1, "b":2}`)
	f(`{"so":null}`, []Edit{del("so")}, `{}`)
	f(`{"so":null}`, []Edit{del("so"), set("k", `"v"`)}, `{"k":"v"}`)
	// Duplicates: the first is replaced, the rest dropped.
	f(`{"s":true,"a":1,"s":false}`, []Edit{set("s", "0")}, `{"s":0,"a":1}`)
	// An escaped key is still found; strings with quotes and escapes skip.
	f(`{"\u0073tream":true,"t":"a\"b\\"}`, []Edit{set("stream", "false")}, `{"\u0073tream":false,"t":"a\"b\\"}`)
	for _, bad := range []string{`[1]`, `"s"`, `{"a":}`, `{"a":1`, ``, `{"a":1}x`} {
		if _, err := EditObject(nil, []byte(bad), set("a", "1")); !errors.Is(err, ErrNotObject) {
			t.Fatalf("EditObject(%q) err = %v", bad, err)
		}
	}
}

func TestFieldAndFirstElement(t *testing.T) {
	obj := []byte(` {"a": {"b":[1]} , "c" : [ {"d":"x"}, 2 ], "e":null, "a":7}`)
	f := func(key, want string, wantOK bool) {
		t.Helper()
		v, ok, err := Field(obj, key)
		if err != nil || ok != wantOK || string(v) != want {
			t.Fatalf("Field(%q) = %q %v %v, want %q %v", key, v, ok, err, want, wantOK)
		}
	}
	f("a", "7", true) // the last of duplicates
	f("c", `[ {"d":"x"}, 2 ]`, true)
	f("e", "null", true)
	f("b", "", false)
	c, _, _ := Field(obj, "c")
	if el, ok := FirstElement(c); !ok || string(el) != `{"d":"x"}` {
		t.Fatalf("FirstElement = %q %v", el, ok)
	}
	for _, s := range []string{`[]`, ` [ ] `, `{}`, `3`} {
		if _, ok := FirstElement([]byte(s)); ok {
			t.Fatalf("FirstElement(%q) found one", s)
		}
	}
}

func TestAppendJSONString(t *testing.T) {
	if got := string(AppendJSONString(nil, "a\"b\\c\n\x01é")); got != `"a\"b\\c\u000a\u0001é"` {
		t.Fatalf("got %s", got)
	}
}

func TestEditObjectAllocatesNothing(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)
	dst := make([]byte, 0, 512)
	n := testing.AllocsPerRun(100, func() {
		_, _ = EditObject(dst[:0], body, Edit{Key: "stream", Value: []byte("false")}, Edit{Key: "stream_options"}, Edit{Key: "max_tokens", Value: []byte("1")})
	})
	if n != 0 {
		t.Fatalf("EditObject allocates %v", n)
	}
}

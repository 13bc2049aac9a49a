package config

import (
	"fmt"
	"strings"
	"testing"
)

func TestValidateNames(t *testing.T) {
	f := func(yaml, want string) {
		t.Helper()
		c := Default()
		if err := c.UnmarshalYAML([]byte("pods: [{model: m, address: '127.0.0.1:1'}, {model: n, address: '127.0.0.1:2'}]\n" + yaml)); err != nil {
			t.Fatal(err)
		}
		c.Provision()
		err := c.Validate()
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: err = %v, want %q", yaml, err, want)
		}
	}
	f("models: [{name: m, adapters: [{name: sql}], fallback: [n]}]\naliases: [{name: chat, targets: [{model: sql, weight: 9}, {model: m}]}]", "")
	f("models: [{name: m, adapters: [{name: n}]}]", `models[0].adapters[0].name = "n" is already the name in pods[1].model`)
	f("models: [{name: m, adapters: [{name: a}, {name: a}]}]", `models[0].adapters[1].name = "a" is already`)
	f("aliases: [{name: chat, targets: [{model: x}]}]", `aliases[0].targets[0].model = "x" is not a model or adapter`)
	f("aliases: [{name: chat, targets: []}]", `aliases[0].targets`)
	f("aliases: [{name: a, targets: [{model: m}]}, {name: b, targets: [{model: a}]}]", `aliases[1].targets[0].model = "a" is not`)
	f("models: [{name: m, fallback: [m]}]", `models[0].fallback[0] = "m" is not another model`)
	f("models: [{name: m, max_loras: -1}]", `models[0].max_loras = -1`)
}

func TestParseAdapters(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		as, err := ParseAdapters(in)
		got := fmt.Sprint(as)
		if err != nil {
			got = "error: " + err.Error()
		}
		if got != want {
			t.Errorf("ParseAdapters(%q) = %s, want %s", in, got, want)
		}
	}
	f("", "[]")
	f(" ", "[]")
	f("sql", "[{sql }]")
	f("sql, fin=/loras/fin", "[{sql } {fin /loras/fin}]")
	f("sql,,fin", `error: adapter "" has no name`)
	f("=/p", `error: adapter "=/p" has no name`)
	f("a b", `error: adapter name "a b" has a quote, backslash or space`)
	f("a=b=c", `error: adapter "a=b=c" has two '='`)
	f("sql,sql=/p", `error: adapter "sql" is listed twice`)

	v := func(adapters, want string) {
		t.Helper()
		c := Default()
		c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:1", Adapters: adapters}}
		c.Provision()
		err := c.Validate()
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: err = %v, want %q", adapters, err, want)
		}
	}
	v("sql,fin=/l/fin", "")
	v("sql,sql", `pods[0].adapters = "sql,sql" adapter "sql" is listed twice`)
	v("m", `pods[0].adapters = "m" names m, a model`)
}

func FuzzParseAdapters(f *testing.F) {
	f.Add("sql, fin=/loras/fin")
	f.Add("a=b=c,,")
	f.Fuzz(func(t *testing.T, s string) {
		as, err := ParseAdapters(s)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, a := range as {
			if a.Name == "" || seen[a.Name] || strings.ContainsAny(a.Name, "=\"' ") {
				t.Fatalf("ParseAdapters(%q) = %v", s, as)
			}
			seen[a.Name] = true
		}
	})
}

package config

import (
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

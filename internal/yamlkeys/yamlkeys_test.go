package yamlkeys

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// TestNameErrors: yaml's errors, which name Go types and lines, are
// named by the keys' paths in the document instead.
func TestNameErrors(t *testing.T) {
	type item struct {
		Weight float64 `yaml:"weight"`
	}
	type doc struct {
		Items []item        `yaml:"items"`
		Every time.Duration `yaml:"every"`
	}
	f := func(data, want string) {
		t.Helper()
		dec := yaml.NewDecoder(bytes.NewReader([]byte(data)))
		dec.KnownFields(true)
		var te *yaml.TypeError
		if err := dec.Decode(&doc{}); !errors.As(err, &te) {
			t.Fatalf("%q: %v, not a type error", data, err)
		}
		if got := NameErrors([]byte(data), reflect.TypeFor[doc](), te); got != want {
			t.Errorf("%q:\n got %s\nwant %s", data, got, want)
		}
	}
	f("items: [{weight: 1}, {wieght: 2}]\n", "items[1].wieght: unknown field (line 1); did you mean weight?")
	f("items:\n  - weight: heavy\n", "items[0].weight: cannot unmarshal !!str `heavy` into float64 (line 2)")
	f("every: 5\n", "every: cannot unmarshal !!int `5` into time.Duration (line 1); a duration has a unit, e.g. 30s or 1m")
	f("colour: red\n", "colour: unknown field (line 1)")
}

// TestQuote: what YAML writes as a string is quoted, a number is not,
// as lb/config's and fleet files' errors show values.
func TestQuote(t *testing.T) {
	type kind string
	f := func(v any, want string) {
		t.Helper()
		if got := Quote(v); got != want {
			t.Errorf("Quote(%#v) = %s, want %s", v, got, want)
		}
	}
	f("a\"b", `"a\"b"`)
	f(kind("tgi"), `"tgi"`)
	f(-time.Second, `"-1s"`)
	f(-1.5, "-1.5")
	f(70000, "70000")
	f([]string{"x"}, "[x]")
}

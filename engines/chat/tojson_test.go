package chat

import "testing"

func TestRewriteToJSON(t *testing.T) {
	f := func(src, want string, wantAll bool) {
		t.Helper()
		got, all := rewriteToJSON(src)
		if got != want || all != wantAll {
			t.Errorf("rewriteToJSON(%q) = %q, %v; want %q, %v", src, got, all, want, wantAll)
		}
	}
	f(`{{ x | tojson }}`, `{{ __pdlb_tojson(x) }}`, true)
	f(`{{- t|tojson(indent=4) }}`, `{{- __pdlb_tojson(t, indent=4) }}`, true)
	f(`{{ a.b[0]['c'] | tojson }}`, `{{ __pdlb_tojson(a.b[0]['c']) }}`, true)
	f(`{{ (a + b) | tojson }}`, `{{ __pdlb_tojson((a + b)) }}`, true)
	f(`{{ '"' + x | tojson + '"' }}`, `{{ '"' + __pdlb_tojson(x) + '"' }}`, true)
	f(`{% set y = f(x, 'a)') | tojson(separators=(',', ':')) %}`, `{% set y = __pdlb_tojson(f(x, 'a)'), separators=(',', ':')) %}`, true)
	f(`{{ x | tojson }}{{ y | tojson }}`, `{{ __pdlb_tojson(x) }}{{ __pdlb_tojson(y) }}`, true)
	f(`{{ 'a | tojson' }} x | tojson`, `{{ 'a | tojson' }} x | tojson`, true)
	f(`{{ x | tojsonish }}`, `{{ x | tojsonish }}`, true)
	f(`{{ x | list | tojson }}`, `{{ x | list | tojson }}`, false)
}

func TestPyFloat(t *testing.T) {
	f := func(x float64, want string) {
		t.Helper()
		if got := pyFloat(x); got != want {
			t.Errorf("pyFloat(%v) = %q, want %q", x, got, want)
		}
	}
	f(1, "1.0")
	f(-0.5, "-0.5")
	f(1e6, "1000000.0")
	f(1e15+0.5, "1000000000000000.5")
	f(1e16, "1e+16")
	f(1.5e-7, "1.5e-07")
	f(0.0001, "0.0001")
	f(0.00001, "1e-05")
	f(1.5e300, "1.5e+300")
}

func TestSeparateTags(t *testing.T) {
	f := func(src, want string) {
		t.Helper()
		if got := separateTags(src); got != want {
			t.Errorf("separateTags(%q) = %q, want %q", src, got, want)
		}
	}
	f("{% if x %}{{ y }}\n{% endif %}", "{% if x %}\n{{ y }}\n{% endif %}")
	f("{{ a }}{{ b }}", "{{ a }}{{ b }}")
	f("{{ a }}{% if x %}", "{{ a }}\n{%- if x %}")
	f("{{ a -}}{{ b }}", "{{ a -}}\n{{ b }}")
	f("{{ a }}{{- b }}", "{{ a }}\n{{- b }}")
	f("{% if x %}{%- if y %}", "{% if x %}\n{%- if y %}")
	f("{# c #}{% if x %}", "{# c #}\n{%- if x %}")
	f("{{ '}}{%' }}{% if x %}", "{{ '}}{%' }}\n{%- if x %}")
	f("{% raw %}{% if %}{% endraw %}", "{% raw %}{% if %}{% endraw %}")
	f("{{ a }", "{{ a }")
}

// FuzzCompile: no template source makes Compile panic (a trusted request
// brings its own), and what compiles renders a chat or errs.
func FuzzCompile(f *testing.F) {
	f.Add(`{% for m in messages %}{{ m.content | tojson(indent=2) }}{% endfor %}`)
	f.Add(`{{ x | list | tojson }}{% if a %}{{ '}}' }}{%- endif %}`)
	f.Add(`{{ f('a)', (b | tojson)) }}{# c #}{% raw %}{{ x }}{% endraw %}`)
	f.Add(`{{ ]]) | tojson }}{{ 'x`)
	c := AcquireConversation()
	if err := c.ParseRequest([]byte(`{"messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src, nil)
		if err != nil {
			return
		}
		tmpl.noPlan = true
		_, _ = tmpl.Render(nil, c, nil)
	})
}

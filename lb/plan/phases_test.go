package plan

import (
	"strings"
	"testing"
)

func TestReadPhases(t *testing.T) {
	f := func(in string, want []Phase) {
		t.Helper()
		got, err := ReadPhases(strings.NewReader(in))
		if err != nil {
			t.Fatalf("ReadPhases(%q): %v", in, err)
		}
		if len(got) != len(want) {
			t.Fatalf("ReadPhases(%q) = %+v, want %+v", in, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("ReadPhases(%q)[%d] = %+v, want %+v", in, i, got[i], want[i])
			}
		}
	}
	chat := Phase{"chat", Demand{Rate: 100, PromptTokens: 2000, OutputTokens: 500, HitRate: 0.6}}
	docs := Phase{"docs", Demand{Rate: 30, PromptTokens: 16000, OutputTokens: 300, HitRate: 0.2, PrefillCap: 25000}}
	f("- {name: chat, rate: 100, isl: 2000, osl: 500, hit: 0.6}\n- name: docs\n  rate: 30\n  isl: 16000\n  osl: 300\n  hit: 0.2\n  prefill_cap: 25000\n",
		[]Phase{chat, docs})
	f(`[{"name": "chat", "rate": 100, "isl": 2000, "osl": 500, "hit": 0.6}]`, []Phase{chat})

	bad := func(in, want string) {
		t.Helper()
		_, err := ReadPhases(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("ReadPhases(%q) = %v, want an error containing %q", in, err, want)
		}
	}
	bad("", "no phases")
	bad("[]", "no phases")
	bad("- {rate: 1}", "phase 1 has no name")
	bad("- {name: x, rate: 1, speed: 3}", "field speed not found")
	bad("- {name: x, rate: -1}", `phase "x": plan: invalid demand: rate = -1`)
	bad("- {name: x, rate: 1, hit: 2}", "hit = 2")
	bad("- {name: x, rate: 1, decode_cap: -5}", "decode_cap = -5")
	bad("{name: x}", "cannot unmarshal")
}

func TestSeedPhases(t *testing.T) {
	for _, p := range SeedPhases() {
		if err := p.Validate(); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
}

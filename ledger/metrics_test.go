package ledger

import (
	"bytes"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

func TestMetricsSeries(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tl.advance(time.Minute)
	tl.sweep() // drops a, b, c: idle since SetPods
	tl.SetPods([]Member{{ID: 3, Name: "ns/a"}, {ID: 4, Name: `odd"name`}})
	p := Prompt{Tokens: 100}
	tk := Ticket{ID: 1}
	tl.Charge(&tk, 3, 4, &p, tl.Now())
	tl.PrefillDone(tk)
	set := metrics.NewSet()
	tl.RegisterMetrics(set)
	// f checks what the set writes.
	f := func(want string) {
		t.Helper()
		var b bytes.Buffer
		set.WritePrometheus(&b)
		if b.String() != want {
			t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
		}
	}
	f(`pd_token_load_active_tokens{pod="ns/a"} 0
pd_token_load_active_tokens{pod="odd\"name"} 0
pd_token_load_kv_tokens{pod="ns/a"} 3600
pd_token_load_kv_tokens{pod="odd\"name"} 0
pd_token_load_decode_tokens{pod="ns/a"} 0
pd_token_load_decode_tokens{pod="odd\"name"} 100
pdlb_ledger_charges_total{pod="ns/a"} 1
pdlb_ledger_charges_total{pod="odd\"name"} 1
`)
	// A dropped pod's series disappear.
	tl.Finish(tk)
	tl.sweep()
	tl.advance(time.Minute)
	tl.sweep()
	f("")
	if len(tl.dropped) != 5 {
		t.Fatalf("dropped %q, want all five pods", tl.dropped)
	}
}

package ledger

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// TestChargesCounterNeverDecreases: a pod replaced under its name (a
// StatefulSet pod restarted: a new UID, so a new id) keeps one
// pdlb_ledger_charges_total series, the sum of both selves; when the
// janitor forgets the old self, its charges must stay in the sum, or the
// counter goes down and Prometheus reads a reset.
func TestChargesCounterNeverDecreases(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tl.advance(time.Minute)
	tl.sweep() // drops a, b, c: idle since SetPods
	set := metrics.NewSet()
	tl.RegisterMetrics(set)
	charges := func() int {
		t.Helper()
		var b bytes.Buffer
		set.WritePrometheus(&b)
		m := regexp.MustCompile(`pdlb_ledger_charges_total\{pod="p"\} (\d+)`).FindStringSubmatch(b.String())
		if m == nil {
			t.Fatalf("no charges series for p:\n%s", b.String())
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	p := Prompt{Tokens: 100}
	tl.SetPods([]Member{{ID: 3, Name: "p"}})
	old := Ticket{ID: 1}
	tl.Charge(&old, 3, 3, &p, tl.Now())
	tl.PrefillDone(old)
	tl.Finish(old)
	tl.SetPods([]Member{{ID: 4, Name: "p"}}) // the pod restarted
	cur := Ticket{ID: 2}
	tl.Charge(&cur, 4, 4, &p, tl.Now()) // outstanding: p stays busy
	before := charges()
	tl.sweep()
	tl.advance(time.Minute)
	tl.sweep() // forgets the old self, idle and gone
	if after := charges(); after < before {
		t.Fatalf("pdlb_ledger_charges_total{pod=\"p\"} went from %d to %d", before, after)
	}
}

package load

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"pdlb/lb/admit"
)

func TestAttainment(t *testing.T) {
	slo := DefaultSLOs() // interactive 2 s and 100 ms; batch 60 s, no TPOT
	ok := func(c admit.Class, ttft, tpot float64, tokens int) Result {
		return Result{Class: c, Outcome: OK, Status: 200, TTFT: ttft, TPOT: tpot, E2E: ttft + tpot*float64(tokens), Tokens: tokens}
	}
	results := []Result{
		ok(admit.Interactive, 0.5, 0.05, 10), // meets both
		ok(admit.Interactive, 2.0, 0.10, 10), // meets both, at the limits
		ok(admit.Interactive, 2.5, 0.05, 10), // misses TTFT
		ok(admit.Interactive, 0.5, 0.20, 10), // misses TPOT
		ok(admit.Interactive, 0.5, 0, 1),     // one token: no TPOT to miss
		{Class: admit.Interactive, Outcome: HTTPError, Status: 429},
		{Class: admit.Interactive, Outcome: Lost},
		{Class: admit.Interactive, Outcome: StreamError, Status: 200},
		ok(admit.Batch, 30, 0.5, 10),  // batch has no TPOT target
		ok(admit.Batch, 61, 0.01, 10), // misses batch TTFT
		{Class: admit.Batch, Outcome: ConnectError},
		{Class: admit.Batch, Outcome: HTTPError, Status: 429},
	}
	rep := newReport(Config{SLO: slo, Arrival: Poisson, Rate: 3}, results, 4*time.Second)
	f := func(got ClassReport, class string, requests, okN int, ttft, tpot, both float64) {
		t.Helper()
		if got.Class != class || got.Requests != requests || got.OK != okN || got.TTFTMet != ttft || got.TPOTMet != tpot || got.Attainment != both {
			t.Fatalf("%+v, want %s requests %d ok %d met %v/%v/%v", got, class, requests, okN, ttft, tpot, both)
		}
	}
	if len(rep.Classes) != 2 {
		t.Fatalf("classes %+v", rep.Classes)
	}
	f(rep.Classes[0], "interactive", 8, 5, 4.0/8, 4.0/8, 3.0/8)
	f(rep.Classes[1], "batch", 4, 2, 1.0/4, 2.0/4, 1.0/4)
	if rep.Requests != 12 || rep.OK != 7 || rep.Lost != 1 || rep.RPS != 3 ||
		rep.Errors["429"] != 2 || rep.Errors["stream"] != 1 || rep.Errors["connect"] != 1 || len(rep.Errors) != 3 {
		t.Fatalf("counts: %+v", rep)
	}
	if rep.TTFT.N != 7 || rep.TPOT.N != 6 || rep.TTFT.Max != 61 {
		t.Fatalf("quantiles TTFT %+v TPOT %+v", rep.TTFT, rep.TPOT)
	}

	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests 12  ok 7  lost 1  errors 429:2 connect:1 stream:1", "interactive", "37.5%", "TTFT"} {
		if !strings.Contains(table.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, table.String())
		}
	}
	// JSON keys are the stable names, and per-request results stay out.
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"requests":12`, `"ttft_s":{`, `"attainment":0.375`, `"errors":{"429":2`, `"lost":1`} {
		if !bytes.Contains(b, []byte(key)) {
			t.Fatalf("JSON lacks %s: %s", key, b)
		}
	}
	if bytes.Contains(b, []byte("Results")) {
		t.Fatal("per-request results leaked into the JSON")
	}
}

func TestQuantiles(t *testing.T) {
	f := func(xs []float64, want Quantiles) {
		t.Helper()
		if got := quantiles(xs); got != want {
			t.Fatalf("quantiles(%v) = %+v, want %+v", xs, got, want)
		}
	}
	f(nil, Quantiles{})
	f([]float64{3}, Quantiles{N: 1, Mean: 3, P50: 3, P90: 3, P99: 3, Max: 3})
	f([]float64{4, 1, 3, 2}, Quantiles{N: 4, Mean: 2.5, P50: 2, P90: 4, P99: 4, Max: 4})
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i)
	}
	f(xs, Quantiles{N: 100, Mean: 50.5, P50: 50, P90: 90, P99: 99, Max: 100})
}

package load

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"pdlb/lb/admit"
)

// Report is what a run measured. Its JSON keys are stable; times are in
// seconds, rates per second, fractions in 0..1.
type Report struct {
	// Target, Model, Arrival, Rate and Concurrency repeat the run's
	// settings, so a saved report says what produced it.
	Target      string  `json:"target"`
	Model       string  `json:"model"`
	Stream      bool    `json:"stream"`
	API         string  `json:"api,omitempty"` // "responses" or "messages"; "" for chat and text completions
	Arrival     string  `json:"arrival"`
	Rate        float64 `json:"rate,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	// Requests is every request sent; OK + sum(Errors) + Lost = Requests.
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	// Errors counts failed requests by HTTP status ("429"), "stream" (an
	// error event midway) and "connect" (no connection).
	Errors map[string]int `json:"errors"`
	// Lost counts requests with no whole answer within the timeout or
	// whose connection broke without an error event.
	Lost int `json:"lost"`
	// Duration is from the first send to the last answer.
	Duration float64 `json:"duration_s"`
	// RPS is Requests per Duration; TokensPerSec the completion tokens of
	// OK requests per Duration.
	RPS          float64 `json:"rps"`
	TokensPerSec float64 `json:"output_tokens_per_s"`
	// TTFT, TPOT and E2E are over OK requests (TPOT over those with at
	// least two tokens).
	TTFT Quantiles `json:"ttft_s"`
	TPOT Quantiles `json:"tpot_s"`
	E2E  Quantiles `json:"e2e_s"`
	// Shed is the latency of the requests answered 429: how fast the
	// gateway refuses what it cannot serve in time.
	Shed Quantiles `json:"shed_s"`
	// Classes is SLO attainment by priority class, for classes with
	// requests.
	Classes []ClassReport `json:"classes"`
	// HitRate is the prefix cache hit rate over the run, from the metrics
	// endpoints given; absent without them. MetricsError says why it is
	// absent when they were given.
	HitRate      *float64 `json:"prefix_cache_hit_rate,omitempty"`
	MetricsError string   `json:"metrics_error,omitempty"`
	// Targets counts the requests by target, in Config's order, when the
	// run had more than one (see targets.go).
	Targets []TargetReport `json:"targets,omitempty"`
	// SamePod is the share of sessions' later turns answered by the pod
	// that answered the session's turn before (x-pdlb-pod); absent when
	// no two turns of a session were both answered with a pod named.
	SamePod *float64 `json:"same_pod,omitempty"`

	// Results are the requests one by one, in the order they ended, for
	// plots.
	Results []Result `json:"-"`
}

// Quantiles summarise latencies, in seconds; zero when there are none.
type Quantiles struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// ClassReport is one priority class's SLO attainment: the fraction of the
// class's requests that met the target. Failed and lost requests count as
// misses, so attainment is what users of the class saw.
type ClassReport struct {
	Class    string  `json:"class"`
	Requests int     `json:"requests"`
	OK       int     `json:"ok"`
	TTFTSLO  float64 `json:"ttft_slo_s"`
	TPOTSLO  float64 `json:"tpot_slo_s,omitempty"`
	// TTFTMet: OK with TTFT ≤ TTFTSLO. TPOTMet: OK with TPOT ≤ TPOTSLO
	// (any OK request when the class has no TPOT target or the answer had
	// fewer than two tokens). Attainment: both.
	TTFTMet    float64 `json:"ttft_attainment"`
	TPOTMet    float64 `json:"tpot_attainment"`
	Attainment float64 `json:"attainment"`
}

// quantiles summarises xs, sorting it.
func quantiles(xs []float64) Quantiles {
	if len(xs) == 0 {
		return Quantiles{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Quantiles{N: len(xs), Mean: sum / float64(len(xs)), P50: rank(xs, 0.50), P90: rank(xs, 0.90), P99: rank(xs, 0.99), Max: xs[len(xs)-1]}
}

// rank is the nearest-rank percentile of sorted xs: the smallest value with
// at least a fraction p of the values at or below it.
func rank(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// meets says a result met its class's targets: TTFT and TPOT separately.
func meets(r *Result, slo SLO) (ttft, tpot bool) {
	if r.Outcome != OK {
		return false, false
	}
	return r.TTFT <= slo.TTFT, slo.TPOT == 0 || !r.HasTPOT() || r.TPOT <= slo.TPOT
}

func newReport(cfg Config, results []Result, elapsed time.Duration) *Report {
	rep := &Report{
		Target: cfg.Target, Model: cfg.Body.Model, Stream: cfg.Body.Stream, Arrival: cfg.Arrival.String(),
		Requests: len(results), Errors: map[string]int{}, Duration: elapsed.Seconds(), Results: results,
	}
	if cfg.Body.named() {
		rep.API = cfg.Body.API
	}
	switch cfg.Arrival {
	case Poisson, Constant:
		rep.Rate = cfg.Rate
	case Closed:
		rep.Concurrency = cfg.Concurrency
	}
	var ttft, tpot, e2e, shed []float64
	var tokens int
	var classes [admit.NumClasses]ClassReport
	var ttftMet, tpotMet, bothMet [admit.NumClasses]int
	for i := range results {
		r := &results[i]
		c := &classes[r.Class]
		c.Requests++
		switch r.Outcome {
		case OK:
			rep.OK++
			c.OK++
			tokens += r.Tokens
			ttft, e2e = append(ttft, r.TTFT), append(e2e, r.E2E)
			if r.HasTPOT() {
				tpot = append(tpot, r.TPOT)
			}
		case HTTPError:
			rep.Errors[strconv.Itoa(r.Status)]++
			if r.Status == 429 {
				shed = append(shed, r.E2E)
			}
		case StreamError:
			rep.Errors["stream"]++
		case ConnectError:
			rep.Errors["connect"]++
		case Lost:
			rep.Lost++
		}
		a, b := meets(r, cfg.SLO[r.Class])
		ttftMet[r.Class] += b2i(a)
		tpotMet[r.Class] += b2i(b)
		bothMet[r.Class] += b2i(a && b)
	}
	if rep.Duration > 0 {
		rep.RPS = float64(rep.Requests) / rep.Duration
		rep.TokensPerSec = float64(tokens) / rep.Duration
	}
	rep.TTFT, rep.TPOT, rep.E2E, rep.Shed = quantiles(ttft), quantiles(tpot), quantiles(e2e), quantiles(shed)
	rep.Targets = byTarget(cfg.all(), results)
	rep.SamePod = samePod(results)
	for i := range classes {
		c := &classes[i]
		if c.Requests == 0 {
			continue
		}
		n := float64(c.Requests)
		c.Class, c.TTFTSLO, c.TPOTSLO = admit.Class(i).String(), cfg.SLO[i].TTFT, cfg.SLO[i].TPOT
		c.TTFTMet, c.TPOTMet, c.Attainment = float64(ttftMet[i])/n, float64(tpotMet[i])/n, float64(bothMet[i])/n
		rep.Classes = append(rep.Classes, *c)
	}
	return rep
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ms formats seconds as milliseconds, the unit LLM latencies are read in.
func ms(s float64) string { return strconv.FormatFloat(s*1000, 'f', 1, 64) }

// WriteTable prints the report as the table `pdlb load` ends with.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	mode := r.Arrival
	switch {
	case r.Rate > 0:
		mode = fmt.Sprintf("%s %.4g req/s", r.Arrival, r.Rate)
	case r.Concurrency > 0:
		mode = fmt.Sprintf("%d concurrent", r.Concurrency)
	}
	stream := "streaming"
	if !r.Stream {
		stream = "not streaming"
	}
	if r.API != "" {
		stream += "  " + r.API + " API"
	}
	fmt.Fprintf(&b, "target %s  model %s  %s  %s\n", r.Target, r.Model, mode, stream)
	fmt.Fprintf(&b, "requests %d  ok %d  lost %d  errors %s  in %.1f s: %.2f req/s, %.0f output tokens/s\n",
		r.Requests, r.OK, r.Lost, r.errorList(), r.Duration, r.RPS, r.TokensPerSec)
	fmt.Fprintf(&b, "%-10s %9s %9s %9s %9s %9s\n", "latency ms", "p50", "p90", "p99", "max", "n")
	for _, row := range []struct {
		name string
		q    Quantiles
	}{{"TTFT", r.TTFT}, {"TPOT", r.TPOT}, {"e2e", r.E2E}, {"429", r.Shed}} {
		if row.q.N == 0 && row.name == "429" {
			continue
		}
		fmt.Fprintf(&b, "%-10s %9s %9s %9s %9s %9d\n", row.name, ms(row.q.P50), ms(row.q.P90), ms(row.q.P99), ms(row.q.Max), row.q.N)
	}
	fmt.Fprintf(&b, "%-12s %8s %9s %9s %10s %10s %11s\n", "class", "requests", "TTFT SLO", "TPOT SLO", "TTFT met", "TPOT met", "attainment")
	for _, c := range r.Classes {
		tpotSLO := "-"
		if c.TPOTSLO > 0 {
			tpotSLO = ms(c.TPOTSLO) + " ms"
		}
		fmt.Fprintf(&b, "%-12s %8d %7.4g s %9s %9.1f%% %9.1f%% %10.1f%%\n",
			c.Class, c.Requests, c.TTFTSLO, tpotSLO, 100*c.TTFTMet, 100*c.TPOTMet, 100*c.Attainment)
	}
	for _, t := range r.Targets {
		fmt.Fprintf(&b, "target %s: requests %d  ok %d  errors %d  lost %d\n", t.Target, t.Requests, t.OK, t.Errors, t.Lost)
	}
	if r.SamePod != nil {
		fmt.Fprintf(&b, "same pod as the session's previous turn %.1f%%\n", 100**r.SamePod)
	}
	switch {
	case r.HitRate != nil:
		fmt.Fprintf(&b, "prefix cache hit rate %.1f%%\n", 100**r.HitRate)
	case r.MetricsError != "":
		fmt.Fprintf(&b, "prefix cache hit rate unknown: %s\n", r.MetricsError)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// errorList formats Errors as "429:3 stream:1", keys sorted, or "0".
func (r *Report) errorList() string {
	if len(r.Errors) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + strconv.Itoa(r.Errors[k])
	}
	return strings.Join(parts, " ")
}

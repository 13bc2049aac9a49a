package config

import (
	"errors"
	"strings"
	"testing"
)

func TestRetryValidate(t *testing.T) {
	f := func(name string, edit func(r *Retry), wantErr string) {
		t.Helper()
		r := DefaultRetry()
		edit(&r)
		err := r.Validate()
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case wantErr != "" && (err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("%s: error %v, want one naming %q", name, err, wantErr)
		}
	}
	f("defaults", func(*Retry) {}, "")
	f("none", func(r *Retry) { r.On = []string{RetryOnNone} }, "")
	f("503 only", func(r *Retry) { r.On = []string{RetryOn503} }, "")
	f("unknown reason", func(r *Retry) { r.On = []string{"reset", "5xx"} }, `upstream.retry_on[1] = "5xx"`)
	f("none with others", func(r *Retry) { r.On = []string{RetryOnNone, RetryOnReset} }, "upstream.retry_on")
	f("budget 0%", func(r *Retry) { r.Budget.Percent = 0 }, "upstream.retry_budget.percent = 0")
	f("budget over 100%", func(r *Retry) { r.Budget.Percent = 120 }, "upstream.retry_budget.percent = 120")
	f("negative minimum", func(r *Retry) { r.Budget.MinRetries = -1 }, "upstream.retry_budget.min_retries = -1")
	f("hedging", func(r *Retry) { r.FirstByte.Factor = 3 }, "")
	f("negative factor", func(r *Retry) { r.FirstByte.Factor = -1 }, "upstream.first_byte.factor = -1")
	f("negative floor", func(r *Retry) { r.FirstByte.Floor = -1 }, "upstream.first_byte.floor")
	f("hedging without timeout retries", func(r *Retry) { r.FirstByte.Factor = 3; r.On = []string{RetryOnReset} }, "upstream.first_byte.factor = 3")
}

// TestRetryYAML: the retry fields sit in the upstream section.
func TestRetryYAML(t *testing.T) {
	c := Default()
	err := c.UnmarshalYAML([]byte("upstream:\n  retry_on: [reset, 503]\n  retry_budget: {percent: 50, min_retries: 1}\n  first_byte: {factor: 4, floor: 500ms}\n"))
	if err == nil {
		err = c.Upstream.Retry.Validate()
	}
	r := c.Upstream.Retry
	if err == nil || !strings.Contains(err.Error(), "first_byte") {
		t.Errorf("hedging without timeout retries: %v", err)
	}
	if strings.Join(r.On, ",") != "reset,503" || r.Budget.Percent != 50 || r.Budget.MinRetries != 1 || r.FirstByte.Factor != 4 || r.FirstByte.Floor.Milliseconds() != 500 {
		t.Errorf("decoded %+v", r)
	}
}

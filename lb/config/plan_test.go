package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPlanSection(t *testing.T) {
	f := func(yml, wantInMsg string) {
		t.Helper()
		c := Default()
		err := c.UnmarshalYAML([]byte(yml + pdPods))
		if err == nil {
			err = c.Validate()
		}
		if wantInMsg == "" {
			if err != nil {
				t.Fatalf("%q: %v", yml, err)
			}
			return
		}
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantInMsg) {
			t.Fatalf("%q: error %v does not mention %q", yml, err, wantInMsg)
		}
	}
	f("plan: {enabled: true, window_sec: 1, min_dwell_sec: 0, switch_roles: true, webhook: {url: 'http://127.0.0.1:9/plan'}}\n", "")
	f("plan: {window_sec: 0}\n", "window_sec = 0")
	f("plan: {hysteresis: -0.1}\n", "hysteresis = -0.1")
	f("plan: {tpot_slo: -1}\n", "plan.tpot_slo = -1")
	f("plan: {decode_max_batch: 0}\n", "plan.decode_max_batch = 0")
	f("plan: {switch_timeout: 0s}\n", `plan.switch_timeout = "0s"`)
	f("plan: {webhook: {url: 'ftp://x/y'}}\n", `plan.webhook.url = "ftp://x/y"`)
	f("plan: {webhook: {url: 'http://h/', retries: -1}}\n", "plan.webhook.retries = -1")
	f("plan: {webhook: {timeout: 0s}}\n", `plan.webhook.timeout = "0s"`)
	f("plan: {total: 4}\n", "total") // the pool's size is each model's, not configured

	c := Default()
	if err := c.UnmarshalYAML([]byte("plan: {enabled: true, warmup_sec: 2}\n" + pdPods)); err != nil {
		t.Fatal(err)
	}
	want := Plan{Enabled: true, WindowSec: 60, DrainSec: 10, WarmupSec: 2, MinDwellSec: 180, Hysteresis: 0.05, TPOTSLO: 0.1,
		DecodeMaxBatch: 64, SwitchTimeout: 10 * time.Minute, Webhook: PlanWebhook{Timeout: 5 * time.Second, Retries: 3}}
	if c.Plan != want {
		t.Fatalf("plan section %+v, want %+v", c.Plan, want)
	}
	if pc := c.Plan.PlannerConfig(7); pc.Total != 7 || pc.WarmupSec != 2 || pc.WindowSec != 60 {
		t.Fatalf("planner config %+v", pc)
	}
}

package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/lb/route"
)

const pdPods = `pods:
  - {name: p, model: m, address: '127.0.0.1:8001', role: prefill, roleset: a, engine: sglang}
  - {name: d, model: m, address: '127.0.0.1:8002', role: decode, roleset: a, engine: sglang}
  - {name: c, model: plain, address: '127.0.0.1:8003'}
`

func TestPDSectionRejects(t *testing.T) {
	f := func(yml, wantInMsg string) {
		t.Helper()
		c := Default()
		err := c.UnmarshalYAML([]byte(yml + pdPods))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantInMsg) {
			t.Fatalf("error %v does not mention %q", err, wantInMsg)
		}
	}
	f("pd: {prefill_score_policy: fastest}\n", `prefill_score_policy (AIBRIX_PREFILL_SCORE_POLICY) = "fastest"`)
	f("pd: {decode_score_ratio_threshold: 0.5}\n", "decode_score_ratio_threshold (AIBRIX_DECODE_SCORE_RATIO_THRESHOLD) = 0.5")
	f("pd: {no_such_knob: 1}\n", "no_such_knob")
	f("models: [{name: m, routing_strategy: fastest}]\n", `routing_strategy = "fastest"`)
	f("models: [{name: m, locked_routing_strategy: fastest}]\n", `locked_routing_strategy = "fastest"`)
	f("models: [{name: m, profiles: [{name: a, pd: {trt_machine_id: 4096}}]}]\n", "trt_machine_id (AIBRIX_TRT_MACHINE_ID) = 4096")
	f("models: [{name: m, profiles: [{name: a, pd: {typo: 1}}]}]\n", "profiles[0].pd")
	f("models: [{name: m, default_profile: b, profiles: [{name: a}]}]\n", `default_profile = "b"`)
	c := Default()
	if err := c.UnmarshalYAML([]byte("pods: [{model: m, address: 'h:1', bootstrap_port: 70000}]\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "pods[0].bootstrap_port = 70000") {
		t.Fatalf("bad bootstrap port: %v", err)
	}
}

// TestPDEnginesOfAModel: a model's prefill and decode pods run one
// engine, in every roleset (a decode leg may move to another roleset's
// pod); its combined pods may run another.
func TestPDEnginesOfAModel(t *testing.T) {
	f := func(pods, wantErr string) {
		t.Helper()
		c := Default()
		if err := c.UnmarshalYAML([]byte("pods:\n" + pods)); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		if wantErr == "" && err != nil || wantErr != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), wantErr)) {
			t.Fatalf("%s: error %v, want %q", pods, err, wantErr)
		}
	}
	const pre = "  - {name: p, model: m, address: 'h:1', role: prefill, roleset: a}\n"
	f(pre+"  - {name: d, model: m, address: 'h:2', role: decode, roleset: a, engine: vllm}\n"+
		"  - {name: c, model: m, address: 'h:3', engine: sglang}\n", "")
	f(pre+"  - {name: d, model: m, address: 'h:2', role: decode, roleset: a, engine: sglang}\n",
		`pods[1].engine = "sglang" (decode pod "d" of model "m") is not vllm, the engine of its prefill pod "p"`)
	f(pre+"  - {name: d, model: m, address: 'h:2', role: decode, roleset: a}\n"+
		"  - {name: p2, model: m, address: 'h:3', role: prefill, roleset: b, engine: trtllm}\n", `pods[2].engine = "trtllm"`)
	f(pre+"  - {name: d, model: other, address: 'h:2', role: decode, roleset: a, engine: sglang}\n", "")
}

func TestProfiles(t *testing.T) {
	c := Default()
	yml := `pd: {decode_first_response_timeout: 5s}
models:
  - name: m
    locked_routing_strategy: ""
    profiles:
      - {name: default}
      - {name: fast, pd: {decode_score_policy: least_request}}
      - {name: flat, routing_strategy: least_request}
`
	if err := c.UnmarshalYAML([]byte(yml + pdPods)); err != nil {
		t.Fatal(err)
	}
	c.Provision()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Pods[0].BootstrapPort != engines.DefaultBootstrapPort || c.Pods[1].BootstrapPort != engines.DefaultBootstrapPort || c.Pods[2].BootstrapPort != 0 {
		t.Fatalf("bootstrap ports %d, %d, %d: want SGLang's default on the SGLang pods only", c.Pods[0].BootstrapPort, c.Pods[1].BootstrapPort, c.Pods[2].BootstrapPort)
	}
	f := func(model, profile, header, wantStrategy string, check func(o route.PDOptions) bool) {
		t.Helper()
		mp, err := c.Profiles(model)
		if err != nil {
			t.Fatal(err)
		}
		res, err := mp.Resolve(profile, header)
		if err != nil || res.Strategy != wantStrategy || (res.PD != nil) != (wantStrategy == route.StrategyPD) {
			t.Fatalf("%s/%s/%s: %+v, %v; want strategy %q", model, profile, header, res, err, wantStrategy)
		}
		if check != nil && !check(res.Profile.PD) {
			t.Fatalf("%s/%s: options %+v", model, profile, res.Profile.PD)
		}
	}
	// A model with prefill/decode pods routes "pd" by default; one without
	// keeps its own policy.
	f("m", "", "", route.StrategyPD, func(o route.PDOptions) bool {
		return o.DecodeFirstResponseTimeout == 5*time.Second && o.DecodeScorePolicy == route.DefaultDecodeScorePolicy
	})
	f("m", "fast", "", route.StrategyPD, func(o route.PDOptions) bool {
		// The override, and the pd section underneath it.
		return o.DecodeScorePolicy == route.DecodePolicyLeastRequest && o.DecodeFirstResponseTimeout == 5*time.Second
	})
	f("m", "flat", "", "least_request", nil)
	f("m", "", "least_request", "least_request", nil)
	f("plain", "", "", "", nil)
	f("plain", "", route.StrategyPD, route.StrategyPD, nil)
}

func TestPDEnvAliases(t *testing.T) {
	env := map[string]string{
		"AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT": "7",
		"AIBRIX_TRT_SCHEDULE_STYLE":            "generation_first",
		"AIBRIX_PREFILL_SCORE_POLICY":          "least_request",
	}
	c := Default()
	if err := c.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if c.PD.DecodeFirstResponseTimeout != 7*time.Second || c.PD.TRTScheduleStyle != route.TRTGenerationFirst {
		t.Fatalf("env not applied: %+v", c.PD)
	}
	bad := func(k string) (string, bool) { return "soon", k == "AIBRIX_DECODE_STREAM_IDLE_TIMEOUT" }
	if err := c.ApplyEnv(bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "AIBRIX_DECODE_STREAM_IDLE_TIMEOUT") {
		t.Fatalf("bad env value: %v", err)
	}

	// Load applies the environment under the file.
	for k, v := range env {
		t.Setenv(k, v)
	}
	path := filepath.Join(t.TempDir(), "pdlb.yaml")
	if err := os.WriteFile(path, []byte("pd: {prefill_score_policy: token_load}\n"+pdPods), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.PD.PrefillScorePolicy != route.PrefillPolicyTokenLoad || c.PD.TRTScheduleStyle != route.TRTGenerationFirst {
		t.Fatalf("file over environment: %+v", c.PD)
	}
}

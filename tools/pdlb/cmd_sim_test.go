package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestCmdSimJSON(t *testing.T) {
	var out bytes.Buffer
	if err := cmdSim([]string{"--rate", "20", "--duration", "10", "--policy", "default", "--reject", "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var got map[string]float64
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v in %q", err, out.String())
	}
	for _, k := range []string{"requests", "hit_rate", "ttft_p50_s", "ttft_p99_s", "attainment", "rejected"} {
		if _, ok := got[k]; !ok {
			t.Fatalf("key %q missing from %s", k, out.String())
		}
	}
	if len(got) != 6 || got["requests"] < 150 || got["attainment"] != 1 || got["hit_rate"] <= 0 {
		t.Fatalf("unexpected result %s", out.String())
	}
}

func TestCmdSimRow(t *testing.T) {
	var out bytes.Buffer
	if err := cmdSim([]string{"--rate", "20", "--duration", "5", "--policy", "min_ttft", "--seed", "3"}, &out); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.HasPrefix(s, "requests ") || !strings.Contains(s, "attainment") || strings.Count(s, "\n") != 1 {
		t.Fatalf("row %q", s)
	}
}

func TestCmdSimErrors(t *testing.T) {
	f := func(want string, args ...string) {
		t.Helper()
		err := cmdSim(args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("cmdSim(%q) = %v, want an error mentioning %q", args, err, want)
		}
	}
	f("unknown policy", "--policy", "nope")
	f("--workload trace needs --trace", "--workload", "trace")
	f("--workload \"poisson\"", "--workload", "poisson")
	f("--rate -1", "--rate", "-1")
	f("pods = 0", "--pods", "0")
	f("no such file", "--workload", "trace", "--trace", "/nonexistent/trace.jsonl")

	var help bytes.Buffer
	if err := cmdSim([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "Usage: pdlb sim") || !strings.Contains(help.String(), "-faithful") {
		t.Fatalf("--help: %v\n%s", err, help.String())
	}
}

func TestCmdSimLoRA(t *testing.T) {
	var out bytes.Buffer
	if err := cmdSim([]string{"--workload", "lora", "--rate", "20", "--duration", "5"}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.HasPrefix(s, "lora-aware slo_cache") || !strings.Contains(s, "\nleast_request ") || !strings.Contains(s, "\nbest without LoRA: ") ||
		strings.Count(s, "\nfloor: ") != 3 || strings.Count(s, "\n") != 6 {
		t.Fatalf("rows %q", s)
	}
}

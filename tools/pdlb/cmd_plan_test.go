package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCmdPlanSeedTable checks that `pdlb plan --phases seed --total 24
// --static 12P12D` prints the global-scheduling study's planner table:
// needs 4P17D, 20P3D, 2P17D, all fitting in 24; loads under 12P12D
// 33%/139%, 160%/25%, 12%/139%.
func TestCmdPlanSeedTable(t *testing.T) {
	var out bytes.Buffer
	if err := cmdPlan([]string{"--phases", "seed", "--total", "24", "--static", "12P12D"}, &out); err != nil {
		t.Fatal(err)
	}
	const want = `24 instances, static 12P12D:
phase                      needs   fits  split   static prefill    static decode
chat                       4P17D   yes   5P19D   33%               139% (overloaded)
long-document summaries    20P3D   yes   21P3D   160% (overloaded) 25%
coding agents              2P17D   yes   2P22D   12%               139% (overloaded)
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestCmdPlanSeedJSON(t *testing.T) {
	var out bytes.Buffer
	if err := cmdPlan([]string{"--phases", "seed", "--total", "24", "--static", "12P12D", "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	want := []string{
		"chat 4P17D 33% 139%",
		"long-document summaries 20P3D 160% 25%",
		"coding agents 2P17D 12% 139%",
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows: %s", len(rows), out.String())
	}
	for i, r := range rows {
		if len(r) != 5 {
			t.Fatalf("row %d has keys %v, want phase, prefill, decode, static_prefill_load, static_decode_load", i, r)
		}
		got := fmt.Sprintf("%s %vP%vD %.0f%% %.0f%%", r["phase"], r["prefill"], r["decode"],
			100*r["static_prefill_load"].(float64), 100*r["static_decode_load"].(float64))
		if got != want[i] {
			t.Fatalf("row %d: %s, want %s", i, got, want[i])
		}
	}
}

func TestCmdPlanFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "phases.yaml")
	// A pool too small for a phase, a per-phase capacity, and the default
	// static split (5P5D).
	const phases = `- {name: burst, rate: 100, isl: 2000, osl: 500, hit: 0.6}
- {name: fast-decode, rate: 100, isl: 2000, osl: 500, hit: 0.6, decode_cap: 10000}
`
	if err := os.WriteFile(file, []byte(phases), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := cmdPlan([]string{"--phases", file, "--total", "10"}, &out); err != nil {
		t.Fatal(err)
	}
	const want = `10 instances, static 5P5D:
phase                      needs   fits  split   static prefill    static decode
burst                      4P17D   no    2P8D    80%               333% (overloaded)
fast-decode                4P5D    yes   4P6D    80%               100%
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestCmdPlanSimulate plays a short seed day through --simulate.
func TestCmdPlanSimulate(t *testing.T) {
	var out bytes.Buffer
	if err := cmdPlan([]string{"--phases", "seed", "--total", "24", "--simulate", "--phase-sec", "60"}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"simulated, 60 s a phase", "static 12P12D", "coding agents", "planner switches:", "switch 12P12D → "} {
		if !strings.Contains(s, want) {
			t.Fatalf("output lacks %q:\n%s", want, s)
		}
	}
}

func TestCmdPlanErrors(t *testing.T) {
	f := func(want string, args ...string) {
		t.Helper()
		err := cmdPlan(args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("cmdPlan(%q) = %v, want an error mentioning %q", args, err, want)
		}
	}
	f("--phases FILE or --phases seed is required", "--total", "24")
	f("--total 0 must be at least 2", "--phases", "seed")
	f("--static 12P10D places 22 instances, --total is 24", "--phases", "seed", "--total", "24", "--static", "12P10D")
	f(`bad ratio "12:12"`, "--phases", "seed", "--total", "24", "--static", "12:12")
	f("decode_cap = 0", "--phases", "seed", "--total", "24", "--decode-cap", "0")
	f("no such file", "--phases", "/nonexistent/phases.yaml", "--total", "24")
	f("unexpected argument", "--phases", "seed", "--total", "24", "extra")
	f("--simulate prints a table", "--phases", "seed", "--total", "24", "--simulate", "--json")
	f("--phase-sec 0 must be positive", "--phases", "seed", "--total", "24", "--simulate", "--phase-sec", "0")

	var help bytes.Buffer
	if err := cmdPlan([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "Usage: pdlb plan") || !strings.Contains(help.String(), "prefill_cap") {
		t.Fatalf("--help: %v\n%s", err, help.String())
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pdlb/internal/testnet"
)

// TestCmdLoadJSON runs pdlb load against a closed port: every request is a
// connect error, and the JSON report says so with its stable keys.
func TestCmdLoadJSON(t *testing.T) {
	addr := testnet.Refusing(t)
	var out bytes.Buffer
	if err := cmdLoad([]string{"--target", "http://" + addr, "--concurrency", "2", "--requests", "5", "--workload", "mixed", "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Requests int            `json:"requests"`
		OK       int            `json:"ok"`
		Errors   map[string]int `json:"errors"`
		Classes  []struct {
			Attainment float64 `json:"attainment"`
		} `json:"classes"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	if got.Requests != 5 || got.OK != 0 || got.Errors["connect"] != 5 || len(got.Classes) != 1 || got.Classes[0].Attainment != 0 {
		t.Fatalf("report %s", out.String())
	}
}

func TestCmdLoadVegeta(t *testing.T) {
	path := filepath.Join(t.TempDir(), "targets.json")
	var out bytes.Buffer
	if err := cmdLoad([]string{"--vegeta", path, "--rate", "2", "--duration", "5s"}, &out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 10 || !strings.Contains(out.String(), "wrote 10 vegeta targets") {
		t.Fatalf("%d targets, output %q", n, out.String())
	}
}

func TestCmdLoadBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--rate", "5", "--concurrency", "2"},
		{"--concurrency", "-2"},
		{"--concurrency", "0"},
		{"--arrival", "bursty"},
		{"--workload", "nope"},
		{"--workload", "trace"},
		{"--target", "http://10.1.2.3:8080", "--requests", "1"},
		{"--duration", "0"},
		{"extra"},
	} {
		err := cmdLoad(args, &bytes.Buffer{})
		if err == nil {
			t.Fatalf("cmdLoad(%q) = %v, want an error", args, err)
		}
	}
}

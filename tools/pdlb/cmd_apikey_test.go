package main

import (
	"bytes"
	"regexp"
	"testing"

	"pdlb/lb/limits"
)

func TestCmdAPIKey(t *testing.T) {
	var out bytes.Buffer
	if err := cmdAPIKey([]string{"--name", "team-a"}, &out); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)^key: (sk-pdlb-\S+)\n\napi_keys:\n  - \{name: "team-a", sha256: ([0-9a-f]{64}),`).FindStringSubmatch(out.String())
	if m == nil || limits.HashKey(m[1]) != m[2] {
		t.Fatalf("output:\n%s", out.String())
	}
	if err := cmdAPIKey([]string{"extra"}, &out); err == nil {
		t.Fatal("an extra argument was accepted")
	}
}

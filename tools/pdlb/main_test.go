package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestFlagErrors: a bad flag is reported once, on stderr, followed by the
// command's usage, and exits 2, as Go's flag package does; --help prints
// the usage on stdout and exits 0.
func TestFlagErrors(t *testing.T) {
	for _, c := range commands {
		var stdout, stderr bytes.Buffer
		rc := run([]string{c.name, "--no-such-flag"}, &stdout, &stderr)
		msg := "flag provided but not defined: -no-such-flag"
		if rc != 2 || stdout.Len() != 0 || strings.Count(stderr.String(), msg) != 1 ||
			!strings.HasPrefix(stderr.String(), "pdlb "+c.name+": "+msg+"\n") || !strings.Contains(stderr.String(), "Usage: pdlb "+c.name) {
			t.Errorf("pdlb %s --no-such-flag: exit %d\nstdout:\n%s\nstderr:\n%s", c.name, rc, stdout.String(), stderr.String())
		}
		stdout.Reset()
		stderr.Reset()
		if rc := run([]string{c.name, "--help"}, &stdout, &stderr); rc != 0 || stderr.Len() != 0 || !strings.HasPrefix(stdout.String(), "Usage: pdlb "+c.name) {
			t.Errorf("pdlb %s --help: exit %d\nstdout:\n%s\nstderr:\n%s", c.name, rc, stdout.String(), stderr.String())
		}
	}
}

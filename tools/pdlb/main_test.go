package main

import (
	"bytes"
	"strings"
	"testing"

	"pdlb/lb/config"
	"pdlb/lb/route"
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

// TestUsage: pdlb alone is a bad command line, its usage on stderr with
// exit 2, as go does; help, -h and --help ask for it, on stdout with exit 0.
func TestUsage(t *testing.T) {
	f := func(args []string, wantRC int, onStderr bool) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		rc := run(args, &stdout, &stderr)
		out, other := &stdout, &stderr
		if onStderr {
			out, other = other, out
		}
		if rc != wantRC || other.Len() != 0 || !strings.Contains(out.String(), "Usage: pdlb <command>") {
			t.Errorf("pdlb %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, rc, wantRC, stdout.String(), stderr.String())
		}
	}
	f(nil, 2, true)
	f([]string{"help"}, 0, false)
	f([]string{"-h"}, 0, false)
	f([]string{"--help"}, 0, false)
}

// TestUnexpectedArguments: an argument no command takes is a bad command
// line, reported as a bad flag is: once on stderr, with the command's
// usage, exit 2.
func TestUnexpectedArguments(t *testing.T) {
	for _, c := range commands {
		var stdout, stderr bytes.Buffer
		rc := run([]string{c.name, "extra"}, &stdout, &stderr)
		if rc != 2 || stdout.Len() != 0 || !strings.HasPrefix(stderr.String(), "pdlb "+c.name+": ") ||
			strings.Count(stderr.String(), "unexpected argument") != 1 || !strings.Contains(stderr.String(), "Usage: pdlb "+c.name) {
			t.Errorf("pdlb %s extra: exit %d\nstdout:\n%s\nstderr:\n%s", c.name, rc, stdout.String(), stderr.String())
		}
	}
}

// TestBadFlagValues: a flag value or combination a command refuses is a
// bad command line too: once on stderr, with the command's usage, exit 2.
func TestBadFlagValues(t *testing.T) {
	f := func(want string, args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		rc := run(args, &stdout, &stderr)
		if rc != 2 || stdout.Len() != 0 || !strings.HasPrefix(stderr.String(), "pdlb "+args[0]+": ") ||
			strings.Count(stderr.String(), want) != 1 || !strings.Contains(stderr.String(), "Usage: pdlb "+args[0]) {
			t.Errorf("pdlb %q: exit %d\nstdout:\n%s\nstderr:\n%s", args, rc, stdout.String(), stderr.String())
		}
	}
	f("--total 1 must be at least 2", "plan", "--phases", "seed", "--total", "1")
	f("--phases FILE or --phases seed is required", "plan", "--total", "4")
	f("give --rate or --concurrency, not both", "load", "--rate", "5", "--concurrency", "2")
	f(`--arrival "burst"`, "load", "--arrival", "burst")
	f(`--workload "nope"`, "sim", "--workload", "nope")
	f("--block-size 0: must be at least 1", "tokenize", "--block-size", "0")
	f(`--engine "tgi"`, "tokenize", "--engine", "tgi")
	f(`--static "12x"`, "plan", "--phases", "seed", "--total", "4", "--static", "12x")
}

// TestUsageAligned: every command's summary starts in one column.
func TestUsageAligned(t *testing.T) {
	var out bytes.Buffer
	usage(&out)
	col := -1
	for _, c := range commands {
		i := strings.Index(out.String(), "\n  "+c.name+" ")
		if i < 0 {
			t.Fatalf("no line for %s:\n%s", c.name, out.String())
		}
		line := out.String()[i+1:]
		at := strings.Index(line, c.summary)
		if col < 0 {
			col = at
		}
		if at != col {
			t.Errorf("%s's summary starts at column %d, the others' at %d:\n%s", c.name, at, col, out.String())
		}
	}
}

// TestHelpShowsDefaults: every command's help says what leaving out a
// number or duration flag gives, which Go prints only when it is not 0: a
// 0 is a setting too (no drain, no limit, a seed), which a flag of a
// string or a bool is not.
func TestHelpShowsDefaults(t *testing.T) {
	for _, c := range commands {
		cmd := c.name
		var stdout, stderr bytes.Buffer
		run([]string{cmd, "--help"}, &stdout, &stderr)
		lines := strings.Split(stdout.String(), "\n")
		for i, l := range lines[:len(lines)-1] {
			name, ok := strings.CutPrefix(l, "  -")
			name, typ, _ := strings.Cut(name, " ")
			if ok && (typ == "duration" || typ == "int" || typ == "uint" || typ == "float") && !strings.Contains(lines[i+1], "default") && !strings.Contains(lines[i+1], "required") {
				t.Errorf("pdlb %s --%s (%s): its help says no default:\n%s", cmd, name, typ, lines[i+1])
			}
		}
	}
}

// TestHelpNamesChoices: demo's --policy names the default and the
// choices, and fleet's help names every column it prints.
func TestHelpNamesChoices(t *testing.T) {
	help := func(cmd string) string {
		var stdout, stderr bytes.Buffer
		run([]string{cmd, "--help"}, &stdout, &stderr)
		return stdout.String()
	}
	demo := help("demo")
	for _, want := range append(route.Names(), "(default "+config.DefaultPolicy) {
		if !strings.Contains(demo, want) {
			t.Errorf("pdlb demo --help does not name %q:\n%s", want, demo)
		}
	}
	fleet := help("fleet")
	for _, want := range []string{"name", "model", "engine", "address", "speedup", "KV-event endpoint"} {
		if !strings.Contains(fleet, want) {
			t.Errorf("pdlb fleet --help does not name %q:\n%s", want, fleet)
		}
	}
}

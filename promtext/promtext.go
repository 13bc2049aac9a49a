// Package promtext writes Prometheus text expositions that follow the
// conventions `promtool check metrics` lints: every family with a HELP text
// and the right TYPE.
//
// github.com/VictoriaMetrics/metrics, which every pdlb component uses, has
// no notion of help texts: with metrics.ExposeMetadata(true) it writes
// "# HELP family" with nothing after it, and without it no metadata at all.
// Write runs its writers with metadata on and fills each HELP line from a
// Doc, so the names and their documentation stay next to the code that
// creates the series.
package promtext

import (
	"bufio"
	"bytes"
	"io"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// Family documents one metric family of an exposition.
type Family struct {
	// Help is the HELP text: what is measured, in which unit.
	Help string
	// Type replaces the TYPE the writer declared, for a library that writes
	// a counter as a gauge (default "": keep the writer's).
	Type string
	// Drop leaves the family out: a library series whose name breaks the
	// conventions and that no dashboard needs (default false).
	Drop bool
}

// Doc maps a family name (no _bucket, _sum or _count suffix) to its
// documentation.
type Doc map[string]Family

// Merge returns one Doc holding every entry of docs; later docs win.
func Merge(docs ...Doc) Doc {
	out := Doc{}
	for _, d := range docs {
		for name, f := range d {
			out[name] = f
		}
	}
	return out
}

// Write runs writers (a metrics.Set's WritePrometheus,
// metrics.WriteProcessMetrics, ...) into a buffer and copies their output
// to w, filling empty HELP lines from doc, applying its TYPE overrides and
// leaving out dropped families. A family doc does not know keeps its empty
// HELP line, which promtool reports: the test of the exposition catches a
// series added without documentation.
//
// Write turns on the library's process-wide metadata switch: every
// exposition pdlb serves goes through Write, and the switch only adds
// comment lines, which any scraper accepts.
func Write(w io.Writer, doc Doc, writers ...func(io.Writer)) error {
	metrics.ExposeMetadata(true)
	var in bytes.Buffer
	for _, write := range writers {
		write(&in)
	}
	out := bufio.NewWriter(w)
	var fam Family
	for len(in.Bytes()) > 0 {
		line, _ := in.ReadBytes('\n')
		if name, text, ok := metadata(line, "# HELP "); ok {
			fam = doc[name]
			if fam.Drop {
				continue
			}
			if text == "" && fam.Help != "" {
				line = []byte("# HELP " + name + " " + escapeHelp(fam.Help) + "\n")
			}
		} else if name, _, ok := metadata(line, "# TYPE "); ok {
			if fam = doc[name]; fam.Type != "" {
				line = []byte("# TYPE " + name + " " + fam.Type + "\n")
			}
		}
		// Samples follow their family's metadata, so fam is the family of
		// every line until the next HELP.
		if fam.Drop {
			continue
		}
		out.Write(line)
	}
	return out.Flush()
}

// metadata parses a "# HELP name text" or "# TYPE name type" line.
func metadata(line []byte, prefix string) (name, rest string, ok bool) {
	if !bytes.HasPrefix(line, []byte(prefix)) {
		return "", "", false
	}
	s := strings.TrimRight(string(line[len(prefix):]), "\n")
	name, rest, _ = strings.Cut(s, " ")
	return name, rest, true
}

// escapeHelp escapes a help text as the text format requires: backslash and
// line feed.
func escapeHelp(s string) string { return helpEscaper.Replace(s) }

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

// Label returns v as a quoted label value of the text format: in double
// quotes, with backslash, double quote and line feed escaped and every
// other byte as it is. Go's %q is not that: it writes \t, \x7f or \u00a0,
// escapes the format lacks, which Prometheus' parsers reject.
func Label(v string) string { return `"` + labelEscaper.Replace(v) + `"` }

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

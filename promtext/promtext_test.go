package promtext

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

func TestWrite(t *testing.T) {
	doc := Doc{
		"a_total":   {Help: `Things done, counted\once.`},
		"b_seconds": {Help: "Latency,\nin seconds."},
		"c_bytes":   {Help: "Bytes.", Type: "counter"},
		"d_count":   {Drop: true},
	}
	f := func(in, want string) {
		t.Helper()
		var out bytes.Buffer
		if err := Write(&out, doc, func(w io.Writer) { io.WriteString(w, in) }); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Fatalf("Write(%q) =\n%s\nwant\n%s", in, out.String(), want)
		}
	}
	f("", "")
	f("# HELP a_total\n# TYPE a_total counter\na_total 1\n",
		"# HELP a_total Things done, counted\\\\once.\n# TYPE a_total counter\na_total 1\n")
	f("# HELP b_seconds\n# TYPE b_seconds histogram\nb_seconds_bucket{le=\"+Inf\"} 1\nb_seconds_sum 0.5\nb_seconds_count 1\n",
		"# HELP b_seconds Latency,\\nin seconds.\n# TYPE b_seconds histogram\nb_seconds_bucket{le=\"+Inf\"} 1\nb_seconds_sum 0.5\nb_seconds_count 1\n")
	// A TYPE override; a dropped family between two kept ones.
	f("# HELP c_bytes\n# TYPE c_bytes gauge\nc_bytes 7\n# HELP d_count\n# TYPE d_count counter\nd_count 3\n# HELP a_total\n# TYPE a_total counter\na_total 2\n",
		"# HELP c_bytes Bytes.\n# TYPE c_bytes counter\nc_bytes 7\n# HELP a_total Things done, counted\\\\once.\n# TYPE a_total counter\na_total 2\n")
	// An undocumented family keeps its empty HELP for promtool to report;
	// a writer's own help text stays; a last line without a line feed stays.
	f("# HELP x\n# TYPE x gauge\nx 1\n", "# HELP x\n# TYPE x gauge\nx 1\n")
	f("# HELP a_total Own text.\na_total 3", "# HELP a_total Own text.\na_total 3")
}

func TestWriteSetTurnsMetadataOn(t *testing.T) {
	s := metrics.NewSet()
	s.NewCounter(`a_total{k="v"}`).Add(2)
	var out bytes.Buffer
	Write(&out, Doc{"a_total": {Help: "A."}}, s.WritePrometheus)
	if want := "# HELP a_total A.\n# TYPE a_total counter\na_total{k=\"v\"} 2\n"; out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestMerge(t *testing.T) {
	d := Merge(Doc{"a": {Help: "1"}, "b": {Help: "2"}}, Doc{"b": {Help: "3"}})
	if len(d) != 2 || d["a"].Help != "1" || d["b"].Help != "3" {
		t.Fatalf("Merge = %v", d)
	}
}

// Every family the library's process writers produce on this platform is
// documented (or dropped).
func TestProcessDocCoversTheLibrary(t *testing.T) {
	var out bytes.Buffer
	Write(&out, ProcessDoc, metrics.WriteProcessMetrics, metrics.WriteFDMetrics)
	if undocumented := regexp.MustCompile(`(?m)^# HELP \S+$`).FindAllString(out.String(), -1); len(undocumented) > 0 {
		t.Fatalf("families without help: %v", undocumented)
	}
	for name, f := range ProcessDoc {
		if f.Drop && strings.Contains(out.String(), "\n"+name) {
			t.Fatalf("dropped family %s still written", name)
		}
	}
}

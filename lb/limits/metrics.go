package limits

import (
	"fmt"
	"io"
	"strings"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/promtext"
)

// Metric families, written at scrape time from the counters kept here, so
// nothing is created per request.
const (
	MetricKeyRefused   = "pdlb_api_key_refused_total"
	MetricKeyInFlight  = "pdlb_api_key_in_flight"
	MetricAuthFailed   = "pdlb_auth_failures_total"
	MetricConnsOpen    = "pdlb_client_conns_open"
	MetricConnsRefused = "pdlb_client_conns_refused_total"
	MetricFDRefused    = "pdlb_fd_limit_refused_total"
)

// MetricsDoc documents the families for promtext.Write; the gateway merges
// it into its own.
var MetricsDoc = promtext.Doc{
	MetricKeyRefused:   {Help: "Requests of an API key refused by one of its limits, by key and limit."},
	MetricKeyInFlight:  {Help: "Requests of an API key admitted and not yet finished."},
	MetricAuthFailed:   {Help: "Requests refused for a missing or unknown API key, by reason."},
	MetricConnsOpen:    {Help: "Client connections open."},
	MetricConnsRefused: {Help: "Client connections answered 429 (reset over TLS) and closed at accept because their address had max_conns_per_ip open."},
	MetricFDRefused:    {Help: "Client connections closed at accept (at=accept) and upstream connections not opened (at=dial) because the process was at its open-files limit, and accepts the kernel refused for want of descriptors or memory, the connection left waiting in the listen queue (at=listen)."},
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// WritePrometheus writes the keys' families in Prometheus text format;
// register it with metrics.Set.RegisterMetricsWriter. Nothing is written
// when keys are off.
func (ks *Keys) WritePrometheus(w io.Writer) {
	if !ks.Enabled() {
		return
	}
	metrics.WriteMetadataIfNeeded(w, MetricAuthFailed, "counter")
	for l := MissingKey; l <= UnknownKey; l++ {
		fmt.Fprintf(w, "%s{reason=%q} %d\n", MetricAuthFailed, l, ks.refused[l].Load())
	}
	metrics.WriteMetadataIfNeeded(w, MetricKeyRefused, "counter")
	for _, k := range ks.keys {
		for l := Concurrency; l < numLimits; l++ {
			fmt.Fprintf(w, "%s{key=\"%s\",limit=%q} %d\n", MetricKeyRefused, labelEscaper.Replace(k.Name), l, k.limited[l].Load())
		}
	}
	metrics.WriteMetadataIfNeeded(w, MetricKeyInFlight, "gauge")
	for _, k := range ks.keys {
		fmt.Fprintf(w, "%s{key=\"%s\"} %d\n", MetricKeyInFlight, labelEscaper.Replace(k.Name), k.InFlight())
	}
}

// WritePrometheus writes the connection families in Prometheus text
// format.
func (cs *Conns) WritePrometheus(w io.Writer) {
	metrics.WriteMetadataIfNeeded(w, MetricConnsOpen, "gauge")
	fmt.Fprintf(w, "%s %d\n", MetricConnsOpen, cs.Open())
	metrics.WriteMetadataIfNeeded(w, MetricConnsRefused, "counter")
	fmt.Fprintf(w, "%s %d\n", MetricConnsRefused, cs.Refused())
}

// WritePrometheus writes the open-files guard's family in Prometheus text
// format.
func (f *FDs) WritePrometheus(w io.Writer) {
	metrics.WriteMetadataIfNeeded(w, MetricFDRefused, "counter")
	fmt.Fprintf(w, "%s{at=\"accept\"} %d\n", MetricFDRefused, f.shed.Load())
	fmt.Fprintf(w, "%s{at=\"dial\"} %d\n", MetricFDRefused, f.refused.Load())
	fmt.Fprintf(w, "%s{at=\"listen\"} %d\n", MetricFDRefused, f.unaccepted.Load())
}

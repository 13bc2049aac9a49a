// Command otlpsink is the proxy benchmark's trace collector: an OTLP/HTTP
// receiver that reads every export and drops it, so pdlb's tracing rows
// pay for making and sending spans but not for a collector's work.
package main

import (
	"flag"
	"io"
	"log"
	"net/http"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:4318", "address to serve OTLP/HTTP on")
	flag.Parse()
	http.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// An empty ExportTraceServiceResponse is zero bytes of protobuf.
		w.Header().Set("Content-Type", "application/x-protobuf")
	})
	log.Fatal(http.ListenAndServe(*listen, nil))
}

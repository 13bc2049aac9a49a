package main

import (
	"context"
	"os"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/tracing"
	"pdlb/lb/config"
)

// simServiceName is the service.name of the simulated pods' spans, apart
// from the gateway's.
const simServiceName = "pdlb-sim"

// traceSims gives the simulated pods of pods a tracer when t or the
// OTEL_* variables turn tracing on (as for the gateway, with the pods'
// own service name); stop sends their last spans.
func traceSims(t config.Tracing, pods []sim.Config) (stop func(), err error) {
	s := t.Settings()
	s.ServiceName = simServiceName
	p, err := tracing.Start(context.Background(), s, simServiceName, os.LookupEnv)
	if err != nil || p == nil {
		return func() {}, err
	}
	tr := p.Tracer("pdlb/engines/sim")
	for i := range pods {
		pods[i].Tracer = tr
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	}, nil
}

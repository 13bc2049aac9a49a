package main

import (
	"encoding/json"
	"fmt"
	"io"

	"pdlb/bench/cluster"
	"pdlb/lb/route"
)

// simLoRA runs pdlb sim --workload lora: w on cfg's fleet with
// cluster.DefaultLoRAMaxLoras adapter slots a pod, one row per way of
// placing (cluster.CompareLoRA).
func simLoRA(cfg cluster.Config, w cluster.LoRAChat, opts route.Options, asJSON bool, stdout io.Writer) error {
	cfg.MaxLoras = cluster.DefaultLoRAMaxLoras
	rows, err := cluster.CompareLoRA(cfg, w, opts)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(rows)
	}
	for _, r := range rows {
		if _, err := fmt.Fprintf(stdout, "%-34s requests %d  swaps/request %.3f  hit %.1f%%  TTFT p50 %.3f s  p99 %.3f s\n",
			r.Name, r.Requests, r.SwapsPerRequest, 100*r.HitRate, r.TTFTP50, r.TTFTP99); err != nil {
			return err
		}
	}
	return nil
}

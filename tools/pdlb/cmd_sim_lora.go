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
// placing (cluster.CompareLoRA), then the floor no placement beats
// (LoRAChat.Floor) and what it leaves of the p99 goal against
// least_request (the second row).
func simLoRA(cfg cluster.Config, w cluster.LoRAChat, opts route.Options, asJSON bool, stdout io.Writer) error {
	cfg.MaxLoras = cluster.DefaultLoRAMaxLoras
	rows, err := cluster.CompareLoRA(cfg, w, opts)
	if err != nil {
		return err
	}
	floor := w.Floor(cfg)
	if asJSON {
		return json.NewEncoder(stdout).Encode(struct {
			Rows  []cluster.LoRARow `json:"rows"`
			Floor cluster.LoRAFloor `json:"floor"`
		}{rows, floor})
	}
	for _, r := range rows {
		if _, err := fmt.Fprintf(stdout, "%-34s requests %d  swaps/request %.3f  waited for a load %.1f%%  hit %.1f%%  TTFT p50 %.3f s  p99 %.3f s\n",
			r.Name, r.Requests, r.SwapsPerRequest, 100*r.LoadWaited, 100*r.HitRate, r.TTFTP50, r.TTFTP99); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(stdout, "floor: %d adapter slots (%d pods × max_loras %d) hold at most %d of %d adapters; each request's adapter is drawn apart from what is held, so at least %.2f%% of requests (the popularity outside the top %d) find theirs neither loaded nor loading and wait for a load and their new tokens' prefill\n",
		floor.Slots, cfg.Pods, cfg.MaxLoras, min(floor.Slots, w.Adapters), w.Adapters, 100*floor.MissShare, floor.Slots)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "floor: the fleet starts cold: each adapter's first request (%.2f%% of requests) finds neither the adapter nor its system prompt anywhere and waits for a load and its whole prompt's prefill\n",
		100*floor.ColdShare)
	if err != nil {
		return err
	}
	if floor.TTFTP99 == 0 {
		_, err = fmt.Fprintf(stdout, "floor: both are at most 1%% of requests: they bound no policy's p99 TTFT\n")
		return err
	}
	lr := rows[1].TTFTP99
	_, err = fmt.Fprintf(stdout, "floor: so every policy's p99 TTFT is at least %.3f s (a load + the prefill of %d tokens): against least_request's %.3f s here, no placement gets below %.2f×\n",
		floor.TTFTP99, floor.Uncached, lr, floor.TTFTP99/lr)
	return err
}

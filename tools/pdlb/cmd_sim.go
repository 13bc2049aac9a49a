package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"pdlb/bench/cluster"
	"pdlb/lb/admit"
	"pdlb/lb/route"
)

var errSimUsage = errors.New("bad flags")

// cmdSim runs bench/cluster's virtual-time simulator once and prints one
// result row (or one JSON object).
func cmdSim(args []string, stdout io.Writer) error {
	fs := newFlagSet("sim", "[flags]",
		`Simulates a fleet of prefill pods in virtual time, routing every request
with the real lb/route policy and lb/admit controller, and prints one row:
requests, prefix cache hit rate, TTFT p50 and p99 (admitted requests), SLO
attainment (requests whose first token came within the SLO; rejected ones
count as misses) and the fraction rejected.

Workloads: seed-chat is the global-scheduling study's multi-turn chat (20
system prompts of 2,048 tokens, 400 sessions, +300 tokens a turn, Poisson
arrivals) on its fleet (8 pods, 20,000 prefill tokens/s, blocks of 64
tokens, an LRU of 3,000 blocks per pod, TTFT SLO 2 s); trace replays a JSONL
file of {"t", "session", "prompt" or "prompt_tokens", "output_tokens", "priority"}.

Example: pdlb sim --rate 70 --policy min_ttft --reject`, stdout)
	workload := fs.String("workload", "seed-chat", "seed-chat, trace or lora (compares LoRA-aware placement with least_request and the best policy without it; --policy is ignored)")
	rate := fs.Float64("rate", 70, "seed-chat arrivals per second")
	duration := fs.Float64("duration", 120, "seed-chat length in seconds")
	policy := fs.String("policy", "default", fmt.Sprintf("routing policy: default (%s) or one of %v", route.DefaultPolicy, route.Names()))
	reject := fs.Bool("reject", false, "run admission: reject requests predicted to miss the SLO (batch ones wait in the deferral queue)")
	seed := fs.Uint64("seed", 0, "seed of the workload and the router's random choices (default 0)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the row")
	pods := fs.Int("pods", cluster.DefaultPods, "number of pods")
	slo := fs.Float64("slo", admit.DefaultInteractiveTTFTSLO, "TTFT SLO of interactive requests, seconds")
	traceFile := fs.String("trace", "", "JSONL trace to replay (--workload trace)")
	faithful := fs.Bool("faithful", false, "route as the global-scheduling study's Python router does: ties go to the first pod and pod speeds are known, not learned (reproduces its min_ttft rows; makes random pick pod 0)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("%w: unexpected argument %q", errSimUsage, fs.Arg(0)))
	}

	name := *policy
	if name == "default" {
		name = route.DefaultPolicy
	}
	opts := route.DefaultOptions()
	opts.TTFTSLO = *slo
	p, err := route.New(name, opts)
	if err != nil {
		return err
	}
	cfg := cluster.DefaultConfig(p)
	cfg.Pods, cfg.Reject, cfg.Seed = *pods, *reject, *seed
	cfg.FirstTie, cfg.KnownSpeed = *faithful, *faithful
	cfg.Admission.Classes[admit.Interactive].TTFTSLO = *slo
	// The simulator does not model decode, so no TPOT target applies.
	cfg.Admission.Classes[admit.Interactive].TPOTSLO = 0

	var w cluster.Workload
	switch *workload {
	case "lora":
		return simLoRA(cfg, cluster.NewLoRAChat(*rate, *duration, cfg.Physics.BlockSize, *seed), opts, *asJSON, stdout)
	case "seed-chat":
		if !(*rate > 0) || !(*duration > 0) {
			return fs.usageError(fmt.Errorf("%w: --rate %v and --duration %v must be positive", errSimUsage, *rate, *duration))
		}
		w = cluster.NewSeedChat(*rate, *duration, cfg.Physics.BlockSize, *seed).Start()
	case "trace":
		if *traceFile == "" {
			return fs.usageError(fmt.Errorf("%w: --workload trace needs --trace FILE", errSimUsage))
		}
		f, err := os.Open(*traceFile)
		if err != nil {
			return err
		}
		tr, err := cluster.ReadTrace(f, cfg.Physics.BlockSize, *seed)
		f.Close()
		if err != nil {
			return err
		}
		w = tr.Start()
	default:
		return fs.usageError(fmt.Errorf("%w: --workload %q (known: seed-chat, trace, lora)", errSimUsage, *workload))
	}

	res, err := cluster.Run(cfg, w)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	_, err = fmt.Fprintf(stdout, "requests %d  hit %.1f%%  TTFT p50 %.2f s  p99 %.2f s  attainment %.1f%%  rejected %.1f%%\n",
		res.Requests, 100*res.HitRate, res.TTFTP50, res.TTFTP99, 100*res.Attainment, 100*res.Rejected)
	return err
}

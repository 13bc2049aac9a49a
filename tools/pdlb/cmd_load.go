package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"pdlb/bench/cluster"
	"pdlb/bench/load"
	"pdlb/lb/admit"
)

var errLoadUsage = errors.New("bad flags")

// defaultLoadRate is the rate of a synthetic workload when neither --rate
// nor --concurrency is given: modest enough for `pdlb demo` at speedup 1.
const defaultLoadRate = 5

// defaultVegetaTargets is how many targets --vegeta writes when the run has
// no count to go by.
const defaultVegetaTargets = 1000

func cmdLoad(args []string, stdout io.Writer) error {
	fs := newFlagSet("load", "[flags]",
		`Sends OpenAI requests to a gateway (or any OpenAI-compatible server) and
measures TTFT (time to the first output token), TPOT (time per output token
after it), end-to-end latency and SLO attainment per priority class; prints a
table (or --json) when the run ends.

Arrivals: Poisson (default) or constant --rate, or a fixed --concurrency; a
trace replays its own times unless --rate or --concurrency is given. A run is
bounded by --duration and/or --requests.

Workloads (deterministic from --seed):
  seed-chat  the global-scheduling study's multi-turn chat: 20 system
             prompts of 2,048 tokens, 400 sessions, +300 tokens a turn,
             the whole history resent
  long-docs  16,000-token prompts (a shared 3,200-token instruction), 300 out
  agents     6,000-token prompts (4 shared 4,800-token prefixes), 2,000 out
  mixed      100- and 30,000-token prompts, AIBrix's token_load case
             (--long-fraction)
  trace      JSONL lines {"t", "session", "prompt" or "prompt_tokens",
             "output_tokens", "priority"} (the file pdlb sim --trace reads)

Example: pdlb load --workload seed-chat --rate 10 --duration 30s --plot plots`, stdout)
	var (
		cfg                      load.Config
		spec                     load.WorkloadSpec
		arrival, metrics, trace  string
		plotDir, vegeta          string
		asJSON, progress         bool
		ttftSLO, tpotSLO, bttSLO float64
	)
	slo := load.DefaultSLOs()
	fs.StringVar(&cfg.Target, "target", load.DefaultTarget, "base URL of the gateway; several, comma-separated, take the requests round robin")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow a target that is not a loopback address")
	fs.StringVar(&cfg.Body.Model, "model", load.DefaultModel, "model of every request")
	fs.BoolVar(&cfg.Body.Stream, "stream", true, "stream answers (stream_options.include_usage); --stream=false measures whole answers")
	fs.BoolVar(&cfg.Body.IgnoreEOS, "ignore-eos", true, "send ignore_eos so vLLM and SGLang generate exactly max_tokens")
	fs.StringVar(&cfg.Body.API, "api", load.APIChat, "API of the requests: chat (chat and text completions, as the workload makes them), responses (OpenAI's Responses API: the system prompt as instructions, the turns or prompt as input, store false) or messages (Anthropic's Messages API as Claude Code's agent loop: the system prompt after a billing header block, the first turn as the user's text and each later one as a tool result answering the assistant's tool call, two tools, a prompt as the user message; max_tokens 4096 when the workload sets none; --ignore-eos is not sent)")
	fs.StringVar(&spec.Name, "workload", load.WorkloadSeedChat, fmt.Sprintf("workload: %s", strings.Join(load.WorkloadNames, ", ")))
	fs.StringVar(&trace, "trace", "", "JSONL trace file of --workload trace")
	fs.Uint64Var(&spec.Seed, "seed", 0, "seed of the workload and of Poisson arrivals (default 0)")
	fs.IntVar(&spec.OutputTokens, "output-tokens", 0, "max_tokens of every request (default 0: the workload's; trace lines keep their own)")
	fs.Float64Var(&spec.LongFraction, "long-fraction", load.DefaultMixLongFraction, "share of 30,000-token prompts in --workload mixed")
	fs.Float64Var(&spec.BatchFraction, "batch-fraction", 0, "share of requests sent with x-priority: batch, 0 to 1 (default 0: none)")
	fs.Float64Var(&cfg.Rate, "rate", defaultLoadRate, "requests per second (open loop)")
	fs.StringVar(&arrival, "arrival", "poisson", "arrivals at --rate: poisson or constant")
	fs.IntVar(&cfg.Concurrency, "concurrency", 0, "requests in flight at once (closed loop) instead of --rate (default 0: --rate)")
	fs.DurationVar(&cfg.Duration, "duration", 30*time.Second, "stop sending after this long (0: no time bound)")
	fs.IntVar(&cfg.Requests, "requests", 0, "stop after this many requests (default 0: no count bound)")
	fs.DurationVar(&cfg.Timeout, "timeout", load.DefaultTimeout, "per-request timeout; past it a request counts as lost")
	fs.IntVar(&cfg.MaxConns, "max-conns", load.DefaultMaxConns, "most connections to the target")
	fs.Float64Var(&ttftSLO, "ttft-slo", slo[admit.Interactive].TTFT, "interactive TTFT target, seconds")
	fs.Float64Var(&tpotSLO, "tpot-slo", slo[admit.Interactive].TPOT, "interactive TPOT target, seconds (0: none)")
	fs.Float64Var(&bttSLO, "batch-ttft-slo", slo[admit.Batch].TTFT, "batch TTFT target, seconds")
	fs.StringVar(&metrics, "metrics", "", "comma-separated /metrics URLs of the pods, read before and after for the prefix cache hit rate")
	fs.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	fs.StringVar(&plotDir, "plot", "", "write PNG charts (latency CDFs, TTFT over time) into this directory")
	fs.StringVar(&vegeta, "vegeta", "", "write the workload's requests as vegeta JSON targets to this file and exit without sending")
	fs.BoolVar(&progress, "progress", false, "print a progress line every second even when stderr is not a terminal")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("%w: unexpected argument %q", errLoadUsage, fs.Arg(0)))
	}
	if t := strings.Split(cfg.Target, ","); len(t) > 1 {
		cfg.Target, cfg.Targets = t[0], t[1:]
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	switch {
	case set["concurrency"] && cfg.Concurrency < 1:
		// Else it would fall through to a rate run the user did not ask for.
		return fs.usageError(fmt.Errorf("%w: --concurrency %d must be at least 1", errLoadUsage, cfg.Concurrency))
	case cfg.Concurrency > 0 && set["rate"]:
		return fs.usageError(fmt.Errorf("%w: give --rate or --concurrency, not both", errLoadUsage))
	case cfg.Concurrency > 0:
		cfg.Arrival = load.Closed
	case spec.Name == load.WorkloadTrace && !set["rate"]:
		cfg.Arrival = load.Replay
		if !set["duration"] {
			cfg.Duration = 0 // the trace bounds the run
		}
	case arrival == "poisson":
		cfg.Arrival = load.Poisson
	case arrival == "constant":
		cfg.Arrival = load.Constant
	default:
		return fs.usageError(fmt.Errorf("%w: --arrival %q (known: poisson, constant)", errLoadUsage, arrival))
	}
	cfg.Seed = spec.Seed
	slo[admit.Interactive] = load.SLO{TTFT: ttftSLO, TPOT: tpotSLO}
	slo[admit.Batch].TTFT = bttSLO
	cfg.SLO = slo
	if metrics != "" {
		cfg.Metrics = strings.Split(metrics, ",")
	}
	if trace != "" {
		f, err := os.Open(trace)
		if err != nil {
			return err
		}
		spec.Trace, err = cluster.ReadTraceRecords(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	w, err := load.NewWorkload(spec)
	if err != nil {
		return err
	}

	if vegeta != "" {
		return writeVegeta(vegeta, w, cfg, stdout)
	}

	if progress || isTerminal(os.Stderr) {
		cfg.Progress = func(p load.Progress) {
			fmt.Fprintf(os.Stderr, "\r%5.0fs  sent %d  in flight %d  ok %d  errors %d  lost %d   ",
				p.Elapsed.Seconds(), p.Sent, p.InFlight, p.OK, p.Errors, p.Lost)
		}
	}
	// Ctrl-C stops sending and still prints what was measured.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := load.Run(ctx, cfg, w)
	if cfg.Progress != nil {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return err
	}
	if plotDir != "" {
		paths, err := rep.WritePlots(plotDir, plotTitle(spec.Name, rep))
		if err != nil {
			return err
		}
		if !asJSON {
			defer fmt.Fprintf(stdout, "plots: %s\n", strings.Join(paths, " "))
		}
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	return rep.WriteTable(stdout)
}

// plotTitle names a run in its charts.
func plotTitle(workload string, rep *load.Report) string {
	switch {
	case rep.Rate > 0:
		return fmt.Sprintf("%s, %s %.4g req/s", workload, rep.Arrival, rep.Rate)
	case rep.Concurrency > 0:
		return fmt.Sprintf("%s, %d concurrent", workload, rep.Concurrency)
	}
	return workload + ", trace times"
}

// writeVegeta writes as many targets as the run would send: --requests, or
// rate × duration, else defaultVegetaTargets (a trace stops at its end).
func writeVegeta(path string, w load.Workload, cfg load.Config, stdout io.Writer) error {
	n := cfg.Requests
	if n == 0 && (cfg.Arrival == load.Poisson || cfg.Arrival == load.Constant) && cfg.Duration > 0 {
		n = int(cfg.Rate * cfg.Duration.Seconds())
	}
	if n == 0 {
		n = defaultVegetaTargets
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	target := strings.TrimSuffix(cfg.Target, "/")
	wrote, err := load.WriteVegetaTargets(f, w, n, target, cfg.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "wrote %d vegeta targets to %s (vegeta attack -format=json -targets=%s)\n", wrote, path, path)
	return err
}

// isTerminal says f is a character device, as a terminal is; pipes and
// files are not, so logs stay free of carriage-return progress lines.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

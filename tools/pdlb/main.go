// Command pdlb is the one binary: the gateway, the simulated fleet, the
// simulator, the planner and the load generator, one subcommand each. It only
// wires flags to packages; every piece of logic lives in those packages.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// command is one subcommand. run parses its own flags from args and returns
// an error to print; flag.ErrHelp means --help was asked for and printed.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout io.Writer) error
}

// commands is the table of subcommands, in the order --help lists them.
var commands = []command{
	{"serve", "run the gateway in front of a fleet", cmdServe},
	{"demo", "run the gateway on an embedded simulated fleet", cmdDemo},
	{"fleet", "run simulated engine pods from a YAML file", cmdFleet},
	{"sim", "simulate routing and admission on a virtual fleet (a multi-turn chat or a trace)", cmdSim},
	{"load", "send LLM load to a gateway and report TTFT, TPOT and SLO attainment", cmdLoad},
	{"apikey", "print a new client API key and its api_keys entry", cmdAPIKey},
	{"tokenize", "show the prompt, token ids and block keys an engine computes for a request", cmdTokenize},
	{"plan", "print the xPyD each phase of load needs and the load under a static ratio", cmdPlan},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		// No command is a bad command line: the usage goes with the errors.
		usage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	var bad *usageError
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(args[1:], stdout)
			switch {
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.As(err, &bad):
				fmt.Fprintf(stderr, "pdlb %s: %v\n%s", c.name, err, bad.usage)
				return 2
			default:
				fmt.Fprintf(stderr, "pdlb %s: %v\n", c.name, err)
				return 1
			}
		}
	}
	fmt.Fprintf(stderr, "pdlb: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, `pdlb is an L7 load balancer for GPU inference fleets: it speaks the OpenAI
HTTP API, routes each request to the pod (or prefill/decode pair) that will
serve it soonest, and streams the tokens back.

Usage: pdlb <command> [flags]

Commands:
`)
	// The summaries start one column past the longest name.
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(w, "  %-*s %s\n", width, c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'pdlb <command> --help' for a command's flags.\n")
}

// flagSet is a command's flags. Its Parse prints --help's usage to stdout,
// as a person running --help expects, and returns a bad flag as a
// usageError, which run prints once on stderr with the usage, as the flag
// package's ExitOnError does.
type flagSet struct {
	*flag.FlagSet
	stdout io.Writer
}

// usageError is a command line the command's flags refuse; usage is the
// command's usage text.
type usageError struct {
	err   error
	usage string
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// newFlagSet returns a flag set whose usage is a synopsis, what the command
// does and its flags.
func newFlagSet(name, synopsis, about string, stdout io.Writer) *flagSet {
	fs := flag.NewFlagSet("pdlb "+name, flag.ContinueOnError)
	// The flag package writes its message and usage on every failure;
	// Parse below writes them once, each where it belongs.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: pdlb %s %s\n\n%s\n\nFlags:\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return &flagSet{fs, stdout}
}

// Parse parses args; on --help it prints the usage to stdout and returns
// flag.ErrHelp, on a bad flag it returns a usageError.
func (f *flagSet) Parse(args []string) error {
	err := f.FlagSet.Parse(args)
	if err == nil {
		return nil
	}
	if errors.Is(err, flag.ErrHelp) {
		f.SetOutput(f.stdout)
		f.Usage()
		f.SetOutput(io.Discard)
		return err
	}
	return f.usageError(err)
}

// usageError returns err, a command line the command refuses after its
// flags parsed (an argument it takes none of), as a usageError, for run to
// report as it reports a bad flag.
func (f *flagSet) usageError(err error) error {
	var usage strings.Builder
	f.SetOutput(&usage)
	f.Usage()
	f.SetOutput(io.Discard)
	return &usageError{err, usage.String()}
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"pdlb/engines/sim"
	"pdlb/lb/config"
)

func cmdFleet(args []string, stdout io.Writer) error {
	fs := newFlagSet("fleet", "--config FILE [--speedup X]",
		`Starts the simulated engine pods a fleet file lists (format: engines/sim
fleet.go; example: engines/sim/testdata/fleet.yaml), prints each pod's name,
model, engine, address, speedup and KV-event endpoint, and serves until
SIGINT or SIGTERM.`, stdout)
	var (
		path    string
		speedup float64
	)
	fs.StringVar(&path, "config", "", "fleet YAML file (required)")
	fs.Float64Var(&speedup, "speedup", 0, "run every pod this much faster than real time (default: each pod's speedup from the file)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " ")))
	}
	if path == "" {
		return errors.New("--config is required")
	}
	setSpeedup := false
	fs.Visit(func(f *flag.Flag) { setSpeedup = setSpeedup || f.Name == "speedup" })
	if setSpeedup && !(speedup > 0) {
		// Its 0 stands for left out: written, it would be ignored.
		return fs.usageError(fmt.Errorf("--speedup %g: must be positive (leave it out for each pod's from the file)", speedup))
	}
	fc, err := sim.LoadFleet(path)
	if err != nil {
		return err
	}
	if setSpeedup {
		for i := range fc.Pods {
			fc.Pods[i].Speedup = speedup
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	return runFleet(fc, stdout, sig)
}

// runFleet starts fc, lists its pods on stdout and closes them when stop
// delivers.
func runFleet(fc sim.FleetConfig, stdout io.Writer, stop <-chan os.Signal) error {
	stopTracing, err := traceSims(config.DefaultTracing(), fc.Pods)
	if err != nil {
		return err
	}
	defer stopTracing()
	fleet, err := sim.StartFleet(fc)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODEL\tENGINE\tADDRESS\tSPEEDUP\tKV EVENTS")
	for i, p := range fleet.Pods() {
		c := p.Config()
		ev := "-"
		if pub := fleet.Publisher(i); pub != nil {
			ev = "tcp://" + dialable(strings.TrimPrefix(pub.Endpoint(), "tcp://"))
			if c.DataParallelSize > 1 {
				ev += fmt.Sprintf(" (%d ranks: ports + rank)", c.DataParallelSize)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\n", c.Name, c.Model, c.Engine, dialable(p.Addr()), c.Speedup, ev)
	}
	if err := tw.Flush(); err != nil {
		return errors.Join(err, fleet.Close())
	}
	fmt.Fprintln(stdout, "\nServing; press Ctrl-C to stop.")
	s := <-stop
	fmt.Fprintf(stdout, "%v: closing the fleet\n", s)
	return fleet.Close()
}

// dialable is listen address addr as a client on this machine dials it:
// a host of every interface (0.0.0.0, [::]) as 127.0.0.1, so that a
// serve config, which refuses those hosts, can take what is listed.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err == nil && (host == "" || ip != nil && ip.IsUnspecified()) {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

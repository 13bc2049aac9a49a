package chaos

import (
	"context"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"pdlb/internal/lbtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, lbtest.LeakOptions()...) }

// TestChaos runs the scenario: 300 requests over 10 s by default, or for
// CHAOS_DURATION (make bench runs CHAOS_DURATION=5m, with CHAOS_REQUESTS
// scaled to match). Nothing may be lost, no request may get an error
// status while another pod was healthy, and the ledgers must end at zero.
func TestChaos(t *testing.T) {
	cfg := Config{}
	if d := os.Getenv("CHAOS_DURATION"); d != "" {
		var err error
		if cfg.Duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("CHAOS_DURATION: %v", err)
		}
		// 30 requests a second, as in the short run.
		cfg.Requests = int(cfg.Duration / (time.Second / 30))
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", rep)
	if rep.Sent != rep.Completed+sum(rep.CleanErrors)+rep.LostTotal() {
		t.Errorf("sent %d is not completed + clean errors + lost", rep.Sent)
	}
	if rep.LostTotal() != 0 {
		t.Errorf("%d requests lost", rep.LostTotal())
	}
	if rep.LedgerAfter != 0 {
		t.Errorf("%d tokens still charged to pods after the load", rep.LedgerAfter)
	}
	if n := sum(rep.HealthyErrors); n > 0 {
		t.Errorf("%d error answers while another pod was healthy %v, from %v", n, sorted(rep.HealthyErrors), sorted(rep.Origins))
	}
	if rep.Completed == 0 {
		t.Error("nothing completed: the scenario is not exercising the gateway")
	}
}

// TestKillAfterFailedRestart: a killed pod whose restart failed (its
// proxy's port was taken meanwhile) is counted, and is down, not gone: the
// next kill it draws restarts it instead of panicking on the missing pod.
func TestKillAfterFailedRestart(t *testing.T) {
	f, err := startFleet(1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	log := slog.New(slog.DiscardHandler)
	f.proxies[0].kill()
	taken, err := net.Listen("tcp", f.proxies[0].addr)
	if err != nil {
		t.Fatal(err)
	}
	fault(context.Background(), f, 0, "kill", time.Millisecond, log)
	taken.Close()
	if f.pods[0] != nil || f.restartsFailed.Load() != 1 {
		t.Fatalf("pod %v, %d restarts failed; want none and 1", f.pods[0], f.restartsFailed.Load())
	}
	// The port is free again, but under go test ./... another package's
	// dial may take it before the restart binds it (fault's comment), so
	// the next kill may fail too; one of a few must bring the pod back.
	for try := 0; try < 5 && f.pods[0] == nil; try++ {
		fault(context.Background(), f, 0, "kill", time.Millisecond, log)
	}
	if f.pods[0] == nil {
		t.Fatalf("the pod was not restarted (%d restarts failed)", f.restartsFailed.Load())
	}
}

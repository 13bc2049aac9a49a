package sim

import (
	"io"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"pdlb/internal/testwait"
)

// TestKilledPodSaysNothing: Kill is a crash. The streams in flight then
// write into connections it cut, which a crashed engine does not log (the
// chaos soak's output held hundreds of such lines). What the process
// writes to its standard error while the pod dies is read back through a
// pipe put in its place, where fasthttp's own logger writes too.
func TestKilledPodSaysNothing(t *testing.T) {
	p := testPod(t, Config{Model: "m", Speedup: 1})
	c := testClient(t)
	var answered sync.WaitGroup
	for range 8 {
		answered.Go(func() {
			postNoFatal(c, "http://"+p.Addr()+"/v1/chat/completions", chatBody("a long answer", map[string]any{"max_tokens": 2000, "stream": true}))
		})
	}
	testwait.For(t, "8 streams running", func() bool { return p.Stats().Running == 8 })

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := unix.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup2(int(w.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	read := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		read <- string(b)
	}()
	err = p.Kill()
	answered.Wait()
	_ = unix.Dup2(stderr, 2)
	_ = unix.Close(stderr)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s := <-read; s != "" {
		t.Fatalf("the killed pod logged:\n%s", s)
	}
}

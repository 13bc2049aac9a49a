package sglang

import (
	"math"
	"strings"
	"testing"

	"pdlb/engines"
)

func TestPDBodies(t *testing.T) {
	var p PD
	x := &engines.Exchange{RequestID: "req-1", PrefillHost: "10.0.0.7", ID: 42}
	orig := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"bootstrap_host":"10.0.0.7","bootstrap_port":8998,"bootstrap_room":42,"rid":"req-1-000000000000002a"}`
	for _, leg := range []string{"prefill", "decode"} {
		var got []byte
		var err error
		if leg == "prefill" {
			got, err = p.PrefillBody(nil, orig, x)
		} else {
			got, err = p.DecodeBody(nil, orig, nil, x)
		}
		if err != nil || string(got) != want {
			t.Fatalf("%s body\n got %s %v\nwant %s", leg, got, err, want)
		}
	}
	// A declared bootstrap port, a client rid kept when the gateway has
	// no id, and a client's own bootstrap fields replaced in place.
	x = &engines.Exchange{PrefillHost: "p", BootstrapPort: 9000, ID: 7}
	got, _ := p.PrefillBody(nil, []byte(`{"rid":"mine","bootstrap_room":1}`), x)
	if string(got) != `{"rid":"mine","bootstrap_room":7,"bootstrap_host":"p","bootstrap_port":9000}` {
		t.Fatalf("got %s", got)
	}
	if path, body := p.Abort(nil, x); path != "" || body != nil {
		t.Fatalf("abort without an id = %q %s, want a close", path, body)
	}
	x.RequestID = `a"b`
	if path, body := p.Abort(nil, x); path != "/abort_request" || string(body) != `{"rid":"a\"b-0000000000000007"}` {
		t.Fatalf("abort = %q %s", path, body)
	}
	if !p.Concurrent() {
		t.Fatal("SGLang legs go out together")
	}
	for range 100 {
		p.Begin(x)
		if x.ID < 0 {
			t.Fatalf("negative bootstrap room %d", x.ID)
		}
	}
}

// TestPDRoomOnRank: with a prefill rank chosen, Begin draws a room that
// SGLang's prefill side runs on that rank (room % ranks), still a random
// int63 a batch's rooms after it stay within.
func TestPDRoomOnRank(t *testing.T) {
	var p PD
	for _, n := range []int{2, 3, 8} {
		for rank := range n {
			x := &engines.Exchange{PrefillRank: rank, PrefillRanks: n}
			seen := map[int64]bool{}
			for range 50 {
				p.Begin(x)
				if x.ID < 0 || x.ID%int64(n) != int64(rank) {
					t.Fatalf("rank %d of %d: room %d", rank, n, x.ID)
				}
				seen[x.ID] = true
			}
			if len(seen) < 50 {
				t.Fatalf("rank %d of %d: %d distinct rooms of 50", rank, n, len(seen))
			}
		}
	}
	// The edges: a room at 0, and rooms in the last run of values below
	// the limit, which a rank past the limit moves back one run.
	const limit = math.MaxInt64 - 2 // a batch of 3
	f := func(room, rank, n, want int64) {
		t.Helper()
		if got := roomOnRank(room, limit, rank, n); got != want {
			t.Errorf("roomOnRank(%d, rank %d of %d) = %d, want %d", room, rank, n, got, want)
		}
	}
	f(0, 1, 2, 1)
	f(5, 0, 4, 4)
	const last int64 = limit - 5 // the last run of 8's first value: limit-1 ≡ 4 (mod 8)
	f(limit-1, 0, 8, last)
	f(limit-1, 4, 8, limit-1)
	f(last, 5, 8, last-3)
	f(limit-1, 7, 8, last-1)
}

// TestRIDsPrefixFree: SGLang aborts every request whose rid starts with
// the one /abort_request names, so no exchange's rid may start with
// another's, even where the request ids do (a client's job-1 and job-10,
// or ids alike).
func TestRIDsPrefixFree(t *testing.T) {
	var p PD
	var rids []string
	for _, id := range []string{"job-1", "job-10", "job-1", "job-1-0", "job-100000000000000000"} {
		x := &engines.Exchange{RequestID: id}
		for range 3 {
			p.Begin(x)
			_, body := p.Abort(nil, x)
			rids = append(rids, string(body[len(`{"rid":`):len(body)-1]))
		}
	}
	for i, a := range rids {
		for j, b := range rids {
			if i != j && strings.HasPrefix(b, strings.TrimSuffix(a, `"`)) {
				t.Errorf("rid %s starts with rid %s", b, a)
			}
		}
	}
}

// TestPDBatchBodies: a completion batch's legs carry bootstrap_host,
// bootstrap_port and bootstrap_room as lists of one per prompt, each
// prompt its own room, as SGLang's router sends them. SGLang runs the
// prompts under rid_0, rid_1, ..., which /abort_request cannot name at
// once, so closing the connection is the abort.
func TestPDBatchBodies(t *testing.T) {
	var p PD
	x := &engines.Exchange{RequestID: "req-2", PrefillHost: "10.0.0.7", BootstrapPort: 9000, Batch: 3, ID: 40}
	orig := []byte(`{"model":"m","prompt":["a","b","c"],"bootstrap_room":5}`)
	want := `{"model":"m","prompt":["a","b","c"],"bootstrap_room":[40,41,42],"bootstrap_host":["10.0.0.7","10.0.0.7","10.0.0.7"],"bootstrap_port":[9000,9000,9000],"rid":"req-2-0000000000000028"}`
	pre, err := p.PrefillBody(nil, orig, x)
	if err != nil || string(pre) != want {
		t.Fatalf("prefill body\n got %s %v\nwant %s", pre, err, want)
	}
	if dec, _ := p.DecodeBody(nil, orig, nil, x); string(dec) != want {
		t.Fatalf("decode body\n got %s\nwant %s", dec, want)
	}
	if path, body := p.Abort(nil, x); path != "" || body != nil {
		t.Fatalf("abort of a batch = %q %s, want a close", path, body)
	}
	x.Batch = 1 << 20
	for range 100 {
		p.Begin(x)
		if x.ID < 0 || x.ID > math.MaxInt64-int64(x.Batch-1) {
			t.Fatalf("bootstrap room %d: the batch's last room is no int63", x.ID)
		}
	}
}

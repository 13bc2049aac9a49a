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

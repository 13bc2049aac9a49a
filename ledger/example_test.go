package ledger_test

import (
	"fmt"
	"os"

	"pdlb/ledger"
)

// The gateway's side of one disaggregated request: fill candidates from the
// ledger and charge the picks under the selection lock, release the active
// part when the prefill returns and the rest when the request ends.
func Example() {
	cfg := ledger.DefaultConfig()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	l := ledger.New(cfg, ledger.Env{})
	// On each pool snapshot: the pods' ids (pool.Pod.ID) and names.
	l.SetPods([]ledger.Member{{ID: 0, Name: "ns/prefill-0"}, {ID: 1, Name: "ns/prefill-1"}, {ID: 2, Name: "ns/decode-0"}})

	p := ledger.Prompt{Tokens: 1200, Model: "llama", SessionKey: "chat-7"}
	l.LockSelection()
	now := l.Now()
	for pod := range int32(2) {
		active, kv := l.Prefill(pod) // → route.Candidate ActiveTokens, KVTokens
		_, _ = active, kv
	}
	tokens, age := l.Decode(2, now) // → route.Candidate DecodeTokens, DecodeAgeSec
	_, _ = tokens, age
	t := ledger.Ticket{ID: 42}             // one per request
	charged := l.Charge(&t, 0, 2, &p, now) // the picks: prefill-0, decode-0
	l.UnlockSelection()
	fmt.Println("prefill charge:", charged)

	l.PrefillDone(t)
	l.WritePrometheus(os.Stdout)
	l.Finish(t)
	// Output:
	// prefill charge: 4700
	// pd_token_load_active_tokens{pod="ns/prefill-0"} 0
	// pd_token_load_active_tokens{pod="ns/prefill-1"} 0
	// pd_token_load_active_tokens{pod="ns/decode-0"} 0
	// pd_token_load_kv_tokens{pod="ns/prefill-0"} 4700
	// pd_token_load_kv_tokens{pod="ns/prefill-1"} 0
	// pd_token_load_kv_tokens{pod="ns/decode-0"} 0
	// pd_token_load_decode_tokens{pod="ns/prefill-0"} 0
	// pd_token_load_decode_tokens{pod="ns/prefill-1"} 0
	// pd_token_load_decode_tokens{pod="ns/decode-0"} 1200
	// pdlb_ledger_charges_total{pod="ns/prefill-0"} 1
	// pdlb_ledger_charges_total{pod="ns/prefill-1"} 0
	// pdlb_ledger_charges_total{pod="ns/decode-0"} 1
}

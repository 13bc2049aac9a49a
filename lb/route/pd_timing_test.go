package route

import "testing"

// BenchmarkPDDecide is one decision over 16 rolesets and two combined pods
// with bucketing on: step 0, both fast paths (which do not fire, so every
// check runs), prefix_cache and load_balancing scoring and the pair pick.
// Budget: 3 µs/op, 0 allocs/op.
func BenchmarkPDDecide(b *testing.B) {
	r := newRouter(b, func(o *PDOptions) { o.PromptLengthBucketing = true })
	cands := benchFleet(16)
	var s PDScratch
	req := &Request{PromptTokens: 3000}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req.Rand = uint64(i)
		if _, err := r.Decide(req, cands, &s); err != nil {
			b.Fatal(err)
		}
	}
}

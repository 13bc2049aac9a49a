package gateway

import (
	"math"
	"strconv"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/config"
	"pdlb/lb/kvindex"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// headerDataParallelRank names the rank of a pod of several data-parallel
// ranks that is to serve the request. vLLM (OpenAIServing.
// _get_data_parallel_rank) and SGLang (extract_routed_dp_rank_from_header)
// honour it; trtllm-serve has no such header.
const headerDataParallelRank = "X-Data-Parallel-Rank"

var dataParallelRank = []byte(headerDataParallelRank)

// rankPin is the data-parallel rank a request is sent to on a pod: rank
// holds blocks of its prompt's blocks, every other rank next at most.
// The zero value sends no rank; busy says rank was too busy to be sent
// the request (rankBusy), which then names none.
type rankPin struct {
	pinned, busy       bool
	rank, blocks, next int32
}

// rankBusyFactor: a rank with requests waiting and more than this many
// times the requests (waiting and running) of its pod's least busy other
// rank is too busy to be named. A queued request waits for a batch slot
// there, where a rank with room starts it at once and the prefix is one
// prefill to recompute.
const rankBusyFactor = 2

// rankBusy says rank r of ranks (a pod's last scrape) is too busy to be
// named; false when the scrape has no count of r.
func rankBusy(ranks []engines.RankLoad, r int) bool {
	if r >= len(ranks) || ranks[r].Waiting == 0 {
		return false
	}
	least := math.Inf(1)
	for o, l := range ranks {
		if o != r {
			least = min(least, l.Running+l.Waiting)
		}
	}
	return ranks[r].Running+ranks[r].Waiting > rankBusyFactor*least
}

// rankFor is the rank of pod that x's request names: the one holding
// strictly the longest prefix of x's prompt, on a vLLM or SGLang pod of
// several ranks whose events the gateway follows, unless the client named
// one itself or the pod's data_parallel_routing is "engine", or the rank
// is busy (rankBusy). A batch of prompts names none: each is a request of
// its own to the engine.
func (g *Gateway) rankFor(x *completion, pod *pool.Pod) rankPin {
	if !namesRanks(pod) || x.hdr[hdrDataParallelRank] != nil || len(x.keys) == 0 || len(x.chains) > 0 {
		return rankPin{}
	}
	var feed *kvindex.Pod
	if ranked := g.ranked.Load(); ranked != nil { // nil on a gateway built without New, in tests
		feed = (*ranked)[pod.ID]
	}
	if feed == nil {
		return rankPin{}
	}
	rank, blocks, next := feed.LongestRank(x.keys)
	if rank < 0 {
		return rankPin{}
	}
	pin := rankPin{pinned: true, rank: int32(rank), blocks: int32(blocks), next: int32(next)}
	if sc := pod.Scraped(); sc != nil && rankBusy(sc.Ranks, rank) {
		pin.pinned, pin.busy = false, true
	}
	return pin
}

// namesRanks says the gateway names ranks of pod, where its KV events
// tell them apart: a vLLM or SGLang pod of several ranks, routed among
// them by prefix.
func namesRanks(pod *pool.Pod) bool {
	return pod.Config.DataParallelSize > 1 && pod.Config.DataParallelRouting != config.DataParallelByEngine &&
		(pod.Engine == engines.VLLM || pod.Engine == engines.SGLang)
}

// sglangPairLeg says pod is SGLang and serves a leg of x's prefill/decode
// pair, which names no rank: the decode side fetches the KV from the
// prefill rank bootstrap_room % the prefill's ranks (the KV receivers of
// sglang/srt/disaggregation; a rank the decode leg names is taken as that
// prefill rank), where the prefill side sends a leg naming none. The room
// alone then chooses the prefill rank (PrefillRank).
func sglangPairLeg(x *completion, pod *pool.Pod) bool {
	return pod.Engine == engines.SGLang && x.pd != nil && x.pd.Decision.Kind == route.PDPair
}

// pinFor is rankFor, counted in pdlb_data_parallel_rank_pins_total when it
// names a rank.
func (g *Gateway) pinFor(x *completion, pod *pool.Pod) rankPin {
	pin := g.rankFor(x, pod)
	if pin.pinned {
		g.metrics.model(x.m).rankPins.Inc()
	}
	return pin
}

// pinRank settles the rank of x's attempt on x.pod, counts it, and sets it
// on x.up when the attempt has one: x.up serves the later attempts, so a
// rank an earlier one set goes first.
func (g *Gateway) pinRank(x *completion) {
	x.pin = g.pinFor(x, x.pod)
	if x.up == nil {
		return
	}
	if x.rankOnUp {
		x.up.Header.DelBytes(dataParallelRank)
		x.rankOnUp = false
	}
	if x.pin.pinned {
		setRank(x.up, x.pin)
		x.rankOnUp = true
	}
}

// setRank adds pin's rank to up, which has none.
func setRank(up *fasthttp.Request, pin rankPin) {
	var buf [12]byte
	up.Header.AddBytesKV(dataParallelRank, strconv.AppendInt(buf[:0], int64(pin.rank), 10))
}

// appendRank appends pin's rank as a header line, when pinned.
func appendRank(dst []byte, pin rankPin) []byte {
	if !pin.pinned {
		return dst
	}
	var buf [12]byte
	return appendHeaderLine(dst, dataParallelRank, strconv.AppendInt(buf[:0], int64(pin.rank), 10))
}

package gateway

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"pdlb/engines/protocols"
	"pdlb/lb/kvindex"
	"pdlb/lb/pool"
)

// kvFeeds follow the KV events of every pod that publishes them into its
// model's prefix index.
type kvFeeds struct {
	feeds []kvFeed
	// indexers of the models some pod publishes for.
	indexers map[*pool.Model]*kvindex.Indexer
	// ranked is a feed of each pod of several data-parallel ranks, by
	// pool.Pod.ID: any of its ranks' tells which rank holds a prompt
	// (kvindex.Pod.LongestRank). Never written once published.
	ranked map[int32]*kvindex.Pod
}

type kvFeed struct {
	pod   *pool.Pod
	model *pool.Model
	subs  []*protocols.KVSubscriber // one per data-parallel rank
	// ranks is rank 0's feed of a pod of several ranks, else nil.
	ranks *kvindex.Pod
}

// feedCounts are a feed's subscriber counters, added up over its ranks;
// connected counts the ranks whose publisher greeted.
type feedCounts struct{ events, gaps, replayed, restarts, connected uint64 }

func (f kvFeed) counts() feedCounts {
	var c feedCounts
	for _, s := range f.subs {
		c.events += s.Counters.Events.Load()
		c.gaps += s.Counters.Gaps.Load()
		c.replayed += s.Counters.Replayed.Load()
		c.restarts += s.Counters.Restarts.Load()
		if s.Connected() {
			c.connected++
		}
	}
	return c
}

// startKVFeeds follows the KV events of s's pods, every rank of a pod of
// several data-parallel ranks. A pod prev already follows into the same
// index, from the same endpoints and ranks, keeps its feed:
// a new one would know none of the blocks the pod stored before, so it
// could not take them out of the index when the pod evicts them, nor
// chain the pod's new blocks to them, unless the pod's replay buffer
// still held its whole history. For the same reason a pod prev follows
// whose endpoints or ranks changed, or that has no kv_events any more,
// loses its blocks in the index (before its new feed starts). prev may be
// nil; on error nothing of it is closed.
func startKVFeeds(s *pool.Snapshot, prev *kvFeeds, log *slog.Logger) (*kvFeeds, error) {
	k := &kvFeeds{indexers: map[*pool.Model]*kvindex.Indexer{}, ranked: map[int32]*kvindex.Pod{}}
	kept := map[int32]kvFeed{}
	if prev != nil {
		for _, f := range prev.feeds {
			kept[f.pod.ID] = f
		}
	}
	for _, m := range s.Models {
		for _, p := range m.Pods {
			old, had := kept[p.ID]
			sameIndex := had && old.model.Prefix == m.Prefix && old.pod.PrefixID == p.PrefixID
			if sameIndex && p.Config.KVEvents != "" && old.model.BlockSize == m.BlockSize &&
				old.pod.Config.KVEvents == p.Config.KVEvents && old.pod.Config.KVReplay == p.Config.KVReplay &&
				old.pod.Config.DataParallelSize == p.Config.DataParallelSize {
				k.keep(kvFeed{pod: p, model: m, subs: old.subs, ranks: old.ranks})
				continue
			}
			if sameIndex {
				// The pod keeps its entries in the index but not its
				// feed (its endpoints or ranks changed: a restarted
				// engine, most likely with an empty cache; or it has
				// none now). No event will take out the blocks the old
				// feed stored: they go now.
				m.Prefix.RemovePod(p.PrefixID)
			}
			if p.Config.KVEvents == "" {
				continue
			}
			if k.indexers[m] == nil {
				ix, err := kvindex.New(m.Prefix, kvindex.Config{BlockSize: m.BlockSize})
				if err != nil {
					k.close(prev)
					return nil, fmt.Errorf("model %q: %w", m.Name, err)
				}
				k.indexers[m] = ix
			}
			f := kvFeed{pod: p, model: m}
			// A subscriber per rank: each numbers its batches, and replays, on its own.
			ranks := k.indexers[m].Ranks(p.PrefixID, m.Name, p.Config.DataParallelSize)
			if len(ranks) > 1 {
				f.ranks = ranks[0]
			}
			for r, rank := range ranks {
				sub, err := protocols.SubscribeKVEvents(p.Config.KVEvents, p.Config.KVReplay, r, rank,
					log.With("pod", p.Config.Name, "rank", r))
				if err != nil {
					k.feeds = append(k.feeds, f)
					k.close(prev)
					return nil, fmt.Errorf("pod %q kv_events, data-parallel rank %d: %w", p.Config.Name, r, err)
				}
				f.subs = append(f.subs, sub)
			}
			log.Info("following KV events", "pod", p.Config.Name, "endpoint", p.Config.KVEvents, "ranks", len(f.subs))
			if namesRanks(p) && len(ranks) > kvindex.MaxRankedRanks {
				log.Warn("data-parallel ranks never named: the prefix index tells this many apart at most; the engine picks them",
					"pod", p.Config.Name, "ranks", len(ranks), "most", kvindex.MaxRankedRanks)
			}
			k.keep(f)
		}
	}
	return k, nil
}

// keep adds f to k's feeds.
func (k *kvFeeds) keep(f kvFeed) {
	k.feeds = append(k.feeds, f)
	if f.ranks != nil {
		k.ranked[f.pod.ID] = f.ranks
	}
}

// close stops the feeds, but those next carries on (or, on a failed
// start, those of prev it kept).
func (k *kvFeeds) close(next *kvFeeds) {
	carried := map[*protocols.KVSubscriber]bool{}
	if next != nil {
		for _, f := range next.feeds {
			for _, s := range f.subs {
				carried[s] = true
			}
		}
	}
	// A Close waits out its subscriber's pause between dials (250 ms)
	// while the publisher is down: closed together, the feeds cost one
	// pause, not one a rank.
	var closing sync.WaitGroup
	for _, f := range k.feeds {
		for _, s := range f.subs {
			if !carried[s] {
				closing.Go(func() { _ = s.Close() })
			}
		}
	}
	closing.Wait()
	k.feeds = nil
}

// serveIndex is GET /admin/index: the prefix index of every model, and the
// KV-event feeds that keep it exact.
func (g *Gateway) serveIndex(w http.ResponseWriter, _ *http.Request) {
	type podIndex struct {
		Pod            string `json:"pod"`
		Blocks         int    `json:"blocks"`
		KVEvents       string `json:"kv_events,omitempty"`
		Ranks          int    `json:"data_parallel_size,omitempty"` // of a pod of several ranks, whose counters add up
		EventsReceived uint64 `json:"events_received,omitempty"`
		Gaps           uint64 `json:"gaps,omitempty"`
		Replayed       uint64 `json:"replayed_batches,omitempty"`
		Restarts       uint64 `json:"restarts,omitempty"`
		// ConnectedRanks is set for a pod with a feed: how many of its
		// ranks (1 without) hold a greeted connection to its publisher.
		ConnectedRanks *uint64 `json:"connected_ranks,omitempty"`
	}
	type modelIndex struct {
		Model     string `json:"model"`
		BlockSize int    `json:"block_size"`
		// Tokenizer is the model's tokenizer directory, or "stand-in";
		// Tokenized counts requests by how their keys were made
		// (exact, stand_in, unindexed: routed without the index).
		Tokenizer string            `json:"tokenizer"`
		Tokenized map[string]uint64 `json:"tokenized"`
		Nodes     int               `json:"nodes"`
		Blocks    int               `json:"blocks"`
		// HeldBlocks is what every slot of the index holds, a pod's blocks
		// counted once per pod: Pods' blocks sum to it, as a pod that
		// left holds none.
		HeldBlocks int        `json:"held_blocks"`
		Bytes      int64      `json:"bytes"`
		Pods       []podIndex `json:"pods"`
	}
	snap := g.pool.Load()
	g.mu.Lock()
	feeds := g.kv.feeds
	g.mu.Unlock()
	out := make([]modelIndex, 0, len(snap.Models))
	for _, m := range snap.Models {
		st := m.Prefix.Stats()
		mi := modelIndex{Model: m.Name, BlockSize: m.BlockSize, Nodes: st.Nodes, Blocks: st.Blocks, Bytes: st.Bytes,
			Tokenizer: "stand-in", Tokenized: map[string]uint64{}}
		if m.Prompt != nil {
			mi.Tokenizer = m.Prompt.Name()
		}
		for _, n := range st.PodBlocks {
			mi.HeldBlocks += n
		}
		for i, c := range g.metrics.model(m).tokenized {
			mi.Tokenized[tokenModeNames[i]] = c.Get()
		}
		for _, p := range m.Pods {
			pi := podIndex{Pod: p.Config.Name, Blocks: st.PodBlocks[p.Slot], KVEvents: p.Config.KVEvents}
			if p.Config.DataParallelSize > 1 {
				pi.Ranks = p.Config.DataParallelSize
			}
			for _, f := range feeds {
				if f.pod.ID == p.ID {
					c := f.counts()
					pi.EventsReceived, pi.Gaps, pi.Replayed, pi.Restarts = c.events, c.gaps, c.replayed, c.restarts
					pi.ConnectedRanks = &c.connected
				}
			}
			mi.Pods = append(mi.Pods, pi)
		}
		out = append(out, mi)
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"models": out})
}

package load

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// cachePairs are the counters a prefix cache hit rate is read from, as
// (hit tokens, queried tokens) by engine: vLLM counts prefix cache queries
// and hits in tokens; SGLang counts cached prompt tokens against all prompt
// tokens. TensorRT-LLM's /metrics is JSON and has neither.
var cachePairs = [][2]string{
	{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
	{"sglang:cached_tokens_total", "sglang:prompt_tokens_total"},
}

// cacheCounters are the hit and queried tokens summed over every endpoint
// and label set.
type cacheCounters struct {
	hits, queries float64
}

// hitRateSince returns the hit rate of the tokens queried between before
// and c; false when none were.
func (c cacheCounters) hitRateSince(before cacheCounters) (float64, bool) {
	q := c.queries - before.queries
	if !(q > 0) {
		return 0, false
	}
	return (c.hits - before.hits) / q, true
}

// maxMetricsBytes bounds one scrape; an engine's exposition is tens of
// kilobytes.
const maxMetricsBytes = 16 << 20

// scrapeCache reads the cache counters of every URL.
func scrapeCache(ctx context.Context, c *http.Client, urls []string) (cacheCounters, error) {
	var sum cacheCounters
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return sum, fmt.Errorf("load: metrics %s: %w", u, err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return sum, fmt.Errorf("load: metrics: %w", err)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBytes))
		resp.Body.Close()
		if err != nil {
			return sum, fmt.Errorf("load: metrics %s: %w", u, err)
		}
		if resp.StatusCode != http.StatusOK {
			return sum, fmt.Errorf("load: metrics %s: status %d", u, resp.StatusCode)
		}
		one := parseCacheCounters(b)
		sum.hits += one.hits
		sum.queries += one.queries
	}
	return sum, nil
}

// parseCacheCounters sums the samples of cachePairs' names in a Prometheus
// text exposition; other lines, comments and unparsable values are
// skipped.
func parseCacheCounters(text []byte) cacheCounters {
	var c cacheCounters
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, maxMetricsBytes)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := bytes.IndexAny(line, "{ ")
		sp := bytes.LastIndexByte(line, ' ')
		if end <= 0 || sp < end {
			continue
		}
		v, err := strconv.ParseFloat(string(line[sp+1:]), 64)
		if err != nil {
			continue
		}
		name := string(line[:end])
		for _, p := range cachePairs {
			switch name {
			case p[0]:
				c.hits += v
			case p[1]:
				c.queries += v
			}
		}
	}
	return c
}

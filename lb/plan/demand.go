// Package plan decides how many of a fixed pool of instances serve prefill
// and how many serve decode, window by window, as the shape of the load
// changes (the global-scheduling study, "The xPyD ratio: following the load").
//
// The arithmetic is the global-scheduling study's: a window's load needs
//
//	P = rate × isl × (1 − hit) / P_cap      prefill instances
//	D = rate × osl / D_cap                  decode instances
//
// where isl and osl are the mean prompt and output lengths in tokens, hit
// the fraction of prompt tokens served from the prefix cache, P_cap one
// prefill instance's speed on uncached prompt tokens (tokens/s) and D_cap one
// decode instance's output throughput under the TPOT target (tokens/s). The
// ceilings of P and D are what the study prints as "needed"; the planner
// works with the fractions. Demand holds the formula, Split fits it into the
// pool, and Planner adds the part that keeps a live fleet from flapping:
// hysteresis, a minimum dwell, and switching only when the gain over the
// next window beats the cost of draining and warming the switched instances.
//
// Everything here is pure arithmetic on values the caller measures: the
// gateway fills windows from live pods and wall time, bench/cluster from
// simulated pods and virtual time.
package plan

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Ratio is a split of instances between the two roles, written xPyD.
type Ratio struct {
	Prefill, Decode int
}

// String writes the ratio as the global-scheduling study does, e.g. "4P17D".
func (r Ratio) String() string { return strconv.Itoa(r.Prefill) + "P" + strconv.Itoa(r.Decode) + "D" }

// Total is the number of instances the ratio places.
func (r Ratio) Total() int { return r.Prefill + r.Decode }

// ErrRatio is returned by ParseRatio for text that is not xPyD.
var ErrRatio = errors.New("plan: bad ratio")

// ParseRatio reads "xPyD" (case-insensitive), x and y non-negative integers.
func ParseRatio(s string) (Ratio, error) {
	u := strings.ToUpper(s)
	p, d, ok := strings.Cut(u, "P")
	if !ok || !strings.HasSuffix(d, "D") {
		return Ratio{}, fmt.Errorf("%w %q: want xPyD, e.g. 12P12D", ErrRatio, s)
	}
	x, err1 := strconv.Atoi(p)
	y, err2 := strconv.Atoi(strings.TrimSuffix(d, "D"))
	if err1 != nil || err2 != nil || x < 0 || y < 0 {
		return Ratio{}, fmt.Errorf("%w %q: want xPyD, e.g. 12P12D", ErrRatio, s)
	}
	return Ratio{x, y}, nil
}

// Demand is the shape of a window's load and what one instance of each role
// can serve. Rates are per second, lengths in tokens.
type Demand struct {
	// Rate is the requests per second offered (admitted or not: rejected
	// requests are demand the fleet failed to serve).
	Rate float64 `json:"rate" yaml:"rate"`
	// PromptTokens and OutputTokens are the mean prompt and output lengths
	// (the global-scheduling study's isl and osl).
	PromptTokens float64 `json:"isl" yaml:"isl"`
	OutputTokens float64 `json:"osl" yaml:"osl"`
	// HitRate is the fraction of prompt tokens served from prefix caches,
	// 0..1.
	HitRate float64 `json:"hit" yaml:"hit"`
	// PrefillCap is one prefill instance's speed on uncached prompt tokens
	// (tokens/s; the global-scheduling study's P_cap, 20,000).
	PrefillCap float64 `json:"prefill_cap" yaml:"prefill_cap"`
	// DecodeCap is one decode instance's output throughput under the TPOT
	// target (tokens/s; the global-scheduling study's D_cap, 3,000). See
	// DecodeCapacity.
	DecodeCap float64 `json:"decode_cap" yaml:"decode_cap"`
}

var errDemand = errors.New("plan: invalid demand")

// Validate rejects a demand the formula cannot use, naming the field and
// quoting the value.
func (d Demand) Validate() error {
	nonNeg := func(name string, v float64) error {
		if !(v >= 0) || math.IsInf(v, 1) {
			return fmt.Errorf("%w: %s = %v must be a finite number ≥ 0", errDemand, name, v)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"rate", d.Rate}, {"isl", d.PromptTokens}, {"osl", d.OutputTokens}} {
		if err := nonNeg(f.name, f.v); err != nil {
			return err
		}
	}
	switch {
	case !(d.HitRate >= 0 && d.HitRate <= 1):
		return fmt.Errorf("%w: hit = %v must be in [0, 1]", errDemand, d.HitRate)
	case !(d.PrefillCap > 0) || math.IsInf(d.PrefillCap, 1):
		return fmt.Errorf("%w: prefill_cap = %v must be a positive number", errDemand, d.PrefillCap)
	case !(d.DecodeCap > 0) || math.IsInf(d.DecodeCap, 1):
		return fmt.Errorf("%w: decode_cap = %v must be a positive number", errDemand, d.DecodeCap)
	}
	return nil
}

// Needs returns the instances of each role the load keeps busy, as
// fractions (the global-scheduling study's need() before its ceilings).
func (d Demand) Needs() (prefill, decode float64) {
	return d.Rate * d.PromptTokens * (1 - d.HitRate) / d.PrefillCap, d.Rate * d.OutputTokens / d.DecodeCap
}

// Needed is the global-scheduling study's "needed xPyD": the ceilings of Needs.
func (d Demand) Needed() Ratio {
	p, q := d.Needs()
	return Ratio{int(math.Ceil(p)), int(math.Ceil(q))}
}

// Load returns each role's utilisation under r: the role's need over the
// instances r gives it (the global-scheduling study's "load"; above 1 is
// overload). A role with no instances has load +Inf when it has work and 0
// when it has none.
func (d Demand) Load(r Ratio) (prefill, decode float64) {
	p, q := d.Needs()
	return load(p, r.Prefill), load(q, r.Decode)
}

func load(need float64, n int) float64 {
	if n == 0 {
		if need > 0 {
			return math.Inf(1)
		}
		return 0
	}
	return need / float64(n)
}

// Shortfall is the fraction of the load r cannot serve, 0..1. A request
// needs both roles, so the split serves min(1, P/p, D/q) of the load, the
// share its scarcer role keeps up with (a role with no need keeps up with
// all of it); the rest queues or is rejected.
func Shortfall(r Ratio, needPrefill, needDecode float64) float64 {
	return 1 - min(1, keepUp(r.Prefill, needPrefill), keepUp(r.Decode, needDecode))
}

func keepUp(n int, need float64) float64 {
	if need <= 0 {
		return 1
	}
	return float64(n) / need
}

// Split places total instances (at least 2) between the roles for needs in
// instances:
//
//   - in proportion to the two needs, P = round(total × p / (p + q)), which
//     gives both roles the same utilisation up to rounding (and so, in a
//     pool too small for the load, the least Shortfall); the spare
//     instances of a pool larger than the load go to both roles in that
//     proportion, as headroom;
//   - when the ceilings fit (⌈p⌉ + ⌈q⌉ ≤ total), each role gets at least its
//     ceiling, so rounding never leaves a role short that the pool could
//     cover;
//   - when they do not fit, the pool is short and the proportional split
//     spreads the shortage evenly;
//   - never below 1 instance a role: a role with no instance cannot serve
//     the first request of a shift in the load, and the planner would need a
//     window to notice.
//
// With no load at all it splits the pool evenly (decode takes the odd one).
func Split(total int, needPrefill, needDecode float64) Ratio {
	if total < 2 {
		panic("BUG: plan: Split of fewer than 2 instances")
	}
	p := total / 2
	if sum := needPrefill + needDecode; sum > 0 {
		p = int(math.Round(float64(total) * needPrefill / sum))
	}
	cp, cd := int(math.Ceil(needPrefill)), int(math.Ceil(needDecode))
	if cp+cd <= total {
		p = min(max(p, cp), total-cd)
	}
	p = min(max(p, 1), total-1)
	return Ratio{p, total - p}
}

// DecodeCapacity is one decode instance's output throughput under a TPOT
// target (tokens/s), for a step time that is a line in the batch size
// (stepSec = base + perSeq × batch; engines/sim's model, and what
// admit.DecodeLine learns from a live pod): the largest batch up to
// maxBatch whose step fits the target, times its steps per second. A
// target of 0 means none, so the batch is maxBatch. It is 0 when even a
// batch of one misses the target.
func DecodeCapacity(base, perSeq float64, maxBatch int, tpotSLO float64) float64 {
	b := maxBatch
	if tpotSLO > 0 && perSeq > 0 {
		// Clamped as a float: a tiny slope allows a batch beyond any int.
		b = int(max(min(math.Floor((tpotSLO-base)/perSeq), float64(b)), 0))
	}
	if b < 1 || (tpotSLO > 0 && base+perSeq*float64(b) > tpotSLO) {
		return 0
	}
	return float64(b) / (base + perSeq*float64(b))
}

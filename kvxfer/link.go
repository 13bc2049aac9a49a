package kvxfer

// Link is the timing model of a KV transfer: a fixed latency (connection
// set-up, the first descriptor's round trip) plus the bytes over the
// bandwidth. It is the one formula for transfer time: engines/sim's
// Physics.TransferSec, bench/cluster and the planner all call it.
type Link struct {
	BytesPerSec float64 // sustained bandwidth, bytes per second
	LatencySec  float64 // per transfer, seconds
}

// Sec is the time to move bytes over the link, in seconds.
func (l Link) Sec(bytes float64) float64 { return l.LatencySec + bytes/l.BytesPerSec }

package engines

import "fmt"

// RankPorts are the KV-event sockets of a pod's data-parallel ranks: rank
// r publishes on EventsPort + r and replays on ReplayPort + r, as vLLM
// offsets both endpoints by the rank.
type RankPorts struct {
	Ranks                  int // 1 or more
	EventsHost, ReplayHost string
	EventsPort, ReplayPort int
	// Replay names the replay port in messages, e.g. "kv_replay's port".
	Replay string
	// ReplaySetting names the setting to change when the sockets meet.
	ReplaySetting string
}

// Problem says why the ranks' ports cannot be, and which setting is at
// fault: "data_parallel_size" when a run of ports ends past 65535,
// ReplaySetting when the replay sockets meet the KV events' on one host;
// "" when they can.
func (r RankPorts) Problem() (setting, why string) {
	last := r.Ranks - 1
	switch {
	case r.EventsPort+last > 65535:
		return "data_parallel_size", fmt.Sprintf("puts rank %d's KV events on port %d (kv_events' port + %d), past 65535", last, r.EventsPort+last, last)
	case r.ReplayPort+last > 65535:
		return "data_parallel_size", fmt.Sprintf("puts rank %d's replay socket on port %d (%s + %d), past 65535", last, r.ReplayPort+last, r.Replay, last)
	case r.EventsHost == r.ReplayHost && r.EventsPort <= r.ReplayPort+last && r.ReplayPort <= r.EventsPort+last:
		return r.ReplaySetting, fmt.Sprintf("puts the replay sockets of ranks 0 to %d on ports %d to %d (%s + rank), where their KV events are (%d to %d); set %s apart",
			last, r.ReplayPort, r.ReplayPort+last, r.Replay, r.EventsPort, r.EventsPort+last, r.ReplaySetting)
	}
	return "", ""
}

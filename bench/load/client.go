package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"pdlb/lb/admit"
	"pdlb/lb/openai"
)

// Outcome is how a request ended.
type Outcome uint8

// Outcomes, as the report counts them.
const (
	// OK: a whole answer (a stream that reached [DONE], or a 200 body).
	OK Outcome = iota
	// HTTPError: an answer with a status other than 200.
	HTTPError
	// StreamError: a 200 stream that ended in an error event.
	StreamError
	// ConnectError: the connection could not be made (nothing was sent).
	ConnectError
	// Lost: no whole answer within the client timeout, or the connection
	// broke without an error event.
	Lost
)

// Result is what one request measured. Times are in seconds.
type Result struct {
	// Start is when the request was due, since the run began. Latencies
	// count from it, not from when a connection was free, so an overloaded
	// target cannot hide its queue by slowing the sender (coordinated
	// omission).
	Start float64
	Class admit.Class
	// PromptTokens is the workload's estimate of the prompt's length.
	PromptTokens int
	Outcome      Outcome
	// Status is the HTTP status, 0 when none came.
	Status int
	// TTFT is the time to the first event carrying output (a non-streamed
	// answer: to its whole body); E2E to the end of the answer.
	TTFT, E2E float64
	// TPOT is (last output − first output) / (Tokens − 1); meaningful only
	// when Tokens ≥ 2 (HasTPOT).
	TPOT float64
	// Tokens is the completion tokens of the answer: the usage figure when
	// the engine sent one, else the output events counted.
	Tokens int
	// Target is the index of the target it went to (Config.Target is 0,
	// Targets[i] is i+1); Session is its conversation; Pod the pod the
	// gateway named (a PD request's prefill pod, x-pdlb-prefill-pod; else
	// x-pdlb-pod), "" when it named none.
	Target  int
	Session string
	Pod     string
}

// HasTPOT says the result has a time per output token.
func (r *Result) HasTPOT() bool { return r.Outcome == OK && r.Tokens >= 2 }

// Header names the gateway reads, and those it answers with.
const (
	headerSession  = "x-session-key"
	headerPriority = "x-priority"
	headerPod      = "x-pdlb-pod"
	// headerPrefillPod names a PD request's prefill pod, the one that
	// holds its prompt's KV cache.
	headerPrefillPod = "x-pdlb-prefill-pod"
)

// setHeaders sets a request's headers from its workload request.
func setHeaders(h http.Header, r *Request) {
	h.Set("Content-Type", "application/json")
	if r.Session != "" {
		h.Set(headerSession, r.Session)
	}
	h.Set(headerPriority, r.Class.String())
}

// readBufSize is the client's read size; a chat chunk is a few hundred bytes.
const readBufSize = 32 << 10

// send posts body for r to target and measures the answer into res. due is
// when the request was due; the caller bounds ctx by the client timeout.
func send(ctx context.Context, c *http.Client, target string, r *Request, body []byte, o BodyOptions, due time.Time, res *Result) {
	res.Class, res.PromptTokens, res.Session = r.Class, r.PromptTokens, r.Session
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+r.Path(o), bytes.NewReader(body))
	if err != nil {
		panic("BUG: load: building a request: " + err.Error())
	}
	setHeaders(req.Header, r)
	resp, err := c.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			res.Outcome = ConnectError
		} else {
			res.Outcome = Lost
		}
		return
	}
	defer resp.Body.Close()
	res.Status, res.Pod = resp.StatusCode, resp.Header.Get(headerPrefillPod)
	if res.Pod == "" {
		res.Pod = resp.Header.Get(headerPod)
	}
	if resp.StatusCode != http.StatusOK {
		// Read the error body so the connection can be reused; what it
		// says does not change the count.
		io.Copy(io.Discard, resp.Body)
		res.Outcome = HTTPError
		res.E2E = time.Since(due).Seconds()
		return
	}
	if !o.Stream {
		readWhole(resp.Body, due, res)
		return
	}
	readStream(resp.Body, due, res, o.named())
}

// readWhole reads a non-streamed answer; its first token reaches the client
// with the rest.
func readWhole(body io.Reader, due time.Time, res *Result) {
	b, err := io.ReadAll(body)
	if err != nil {
		res.Outcome = Lost
		return
	}
	res.E2E = time.Since(due).Seconds()
	res.TTFT = res.E2E
	if !json.Valid(b) {
		res.Outcome = Lost
		return
	}
	// A completion's usage.completion_tokens, a Responses answer's
	// usage.output_tokens.
	var tc openai.TokenCounter
	tc.ObserveBody(b)
	res.Tokens, res.Outcome = tc.Tokens(), OK
}

// readStream reads an SSE answer event by event. An event that raises the
// token count carries output; the usage chunk that follows the last token
// raises it too when the engine merged tokens into chunks, and engines send
// it in the same write as the last token, so it does not move the end of
// the output measurably. A completion's stream is whole at its [DONE]; a
// stream of named events (named: the Responses and Messages APIs') at its
// response.completed, response.incomplete or message_stop event, and its
// error and response.failed events are the stream's error.
func readStream(body io.Reader, due time.Time, res *Result, named bool) {
	var (
		split       openai.Splitter
		tc          openai.TokenCounter
		first, last time.Time
		done, bad   bool
		buf         = make([]byte, readBufSize)
	)
	for {
		n, err := body.Read(buf)
		now := time.Now()
		split.Feed(buf[:n])
		for ev, ok := split.Next(); ok; ev, ok = split.Next() {
			var name []byte
			if named {
				name = eventName(ev)
			}
			switch {
			case ev.Done():
				done = true
			case ev.IsError(), string(name) == "error", string(name) == "response.failed":
				bad = true
			default:
				switch string(name) {
				case "response.completed", "response.incomplete", "message_stop":
					done = true
				}
				before := tc.Tokens()
				tc.Observe(ev)
				if tc.Tokens() > before {
					if first.IsZero() {
						first = now
					}
					last = now
				}
			}
		}
		if err != nil {
			break
		}
	}
	res.E2E = time.Since(due).Seconds()
	res.Tokens = tc.Tokens()
	switch {
	case bad:
		res.Outcome = StreamError
	case !done || split.Err() != nil:
		res.Outcome = Lost
	default:
		res.Outcome = OK
	}
	if first.IsZero() {
		res.TTFT = res.E2E
		return
	}
	res.TTFT = first.Sub(due).Seconds()
	if res.Tokens >= 2 {
		res.TPOT = last.Sub(first).Seconds() / float64(res.Tokens-1)
	}
}

// eventName is the type of a named stream event: its "event:" field,
// which OpenAI, Anthropic and vLLM send, else its data's "type".
func eventName(ev openai.Event) []byte {
	for rest := []byte(ev); len(rest) > 0; {
		line, after, _ := bytes.Cut(rest, []byte("\n"))
		if name, ok := bytes.CutPrefix(bytes.TrimSuffix(line, []byte("\r")), []byte("event:")); ok {
			return bytes.TrimSpace(name)
		}
		rest = after
	}
	var d struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(ev.Data(), &d)
	return []byte(d.Type)
}

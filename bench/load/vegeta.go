package load

import (
	"encoding/json"
	"io"
	"net/http"
)

// vegetaTarget is one line of vegeta's JSON target format (vegeta attack
// -format=json): the body as base64, which encoding/json makes of a []byte.
type vegetaTarget struct {
	Method string      `json:"method"`
	URL    string      `json:"url"`
	Body   []byte      `json:"body"`
	Header http.Header `json:"header"`
}

// WriteVegetaTargets writes the next n requests of w as vegeta JSON targets
// against target (a base URL such as http://127.0.0.1:8080), with the
// headers a run would send, for plain HTTP tests of the gateway (vegeta
// measures whole responses, not tokens). It returns how many it wrote: fewer
// than n when w ends first.
func WriteVegetaTargets(out io.Writer, w Workload, n int, target string, o BodyOptions) (int, error) {
	enc := json.NewEncoder(out)
	var (
		r   Request
		buf []byte
	)
	for i := range n {
		if !w.Next(&r) {
			return i, nil
		}
		buf = r.AppendBody(buf[:0], o)
		t := vegetaTarget{Method: http.MethodPost, URL: target + r.Path(o), Body: buf, Header: http.Header{}}
		setHeaders(t.Header, &r)
		if err := enc.Encode(&t); err != nil {
			return i, err
		}
	}
	return n, nil
}

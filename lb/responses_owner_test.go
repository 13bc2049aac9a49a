package lb_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// TestResponsesOwnedByKey: with api_keys set, a stored response is its
// key's: another key retrieving, cancelling, deleting or continuing it
// gets the 404 of an id no pod holds, word for word, and so does a
// response the gateway does not remember (made on the pod directly here,
// as through another replica), which it does not seek; its own key gets
// it.
func TestResponsesOwnedByKey(t *testing.T) {
	p, gateways := keyedResponses(t, 1)
	ask := func(key, method, path, body string) (int, string) {
		t.Helper()
		return askAs(t, gateways[0], key, method, path, body)
	}
	create := func(key, extra string) string {
		t.Helper()
		code, b := ask(key, "POST", "/v1/responses", `{"model":"m","input":"hello"`+extra+`}`)
		var r struct{ ID string }
		if err := json.Unmarshal([]byte(b), &r); code != 200 || err != nil || r.ID == "" {
			t.Fatalf("create: %d %s", code, b)
		}
		return r.ID
	}
	id := create("sk-a", "")
	named := create("sk-a", `,"request_id":"`+taggedID(t, "sk-a")+`"`)
	// What an id no one made gets, the id aside.
	code, never := ask("sk-b", "GET", "/v1/responses/resp_never", "")
	if code != 404 {
		t.Fatalf("never made: %d %s", code, never)
	}
	unknown := func(id string) string { return strings.ReplaceAll(strings.TrimSpace(never), "resp_never", id) }
	for _, id := range []string{id, named} {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/v1/responses/" + id, ""},
			{"POST", "/v1/responses/" + id + "/cancel", ""},
			{"DELETE", "/v1/responses/" + id, ""},
			{"POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"` + id + `"}`},
		} {
			if code, b := ask("sk-b", r.method, r.path, r.body); code != 404 || strings.TrimSpace(b) != unknown(id) {
				t.Errorf("b: %s %s: %d %s, want 404 %s", r.method, r.path, code, b, unknown(id))
			}
		}
		if code, b := ask("sk-a", "GET", "/v1/responses/"+id, ""); code != 200 || !strings.Contains(b, id) {
			t.Errorf("a: GET %s: %d %s", id, code, b)
		}
	}
	if code, b := ask("sk-a", "POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"`+id+`"}`); code != 200 {
		t.Errorf("a: follow-up: %d %s", code, b)
	}
	// Made on the pod directly: the gateway does not know whose it is.
	resp, err := client.Post("http://"+p.Addr()+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":"hi","request_id":"resp_elsewhere"}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("direct: %v %v", resp, err)
	}
	resp.Body.Close()
	if code, b := ask("sk-a", "GET", "/v1/responses/resp_elsewhere", ""); code != 404 || strings.TrimSpace(b) != unknown("resp_elsewhere") {
		t.Errorf("unremembered: %d %s", code, b)
	}
}

// TestResponsesOwnedAcrossReplicas: with api_keys set, a replica that
// does not remember a response (another replica made it) seeks it for
// the key it was made for, whose tag its id carries (the gateway's, or
// one the client named with its tag), and for no other: another key gets
// the 404 of an id no pod holds.
func TestResponsesOwnedAcrossReplicas(t *testing.T) {
	_, gateways := keyedResponses(t, 2)
	made, other := gateways[0], gateways[1]
	var ids []string
	for _, extra := range []string{"", `,"request_id":"` + taggedID(t, "sk-a") + `"`} {
		code, b := askAs(t, made, "sk-a", "POST", "/v1/responses", `{"model":"m","input":"hello"`+extra+`}`)
		var r struct{ ID string }
		if err := json.Unmarshal([]byte(b), &r); code != 200 || err != nil || r.ID == "" {
			t.Fatalf("create: %d %s", code, b)
		}
		ids = append(ids, r.ID)
	}
	id, named := ids[0], ids[1]
	_, never := askAs(t, other, "sk-a", "GET", "/v1/responses/resp_never", "")
	unknown := func(id string) string { return strings.ReplaceAll(strings.TrimSpace(never), "resp_never", id) }
	// b first: a found response is remembered as a's.
	if code, b := askAs(t, other, "sk-b", "GET", "/v1/responses/"+id, ""); code != 404 || strings.TrimSpace(b) != unknown(id) {
		t.Errorf("b, through the other replica: %d %s, want 404 %s", code, b, unknown(id))
	}
	if code, b := askAs(t, other, "sk-a", "GET", "/v1/responses/"+id, ""); code != 200 || !strings.Contains(b, id) {
		t.Errorf("a, through the other replica: %d %s", code, b)
	}
	if code, b := askAs(t, other, "sk-a", "POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"`+id+`"}`); code != 200 {
		t.Errorf("a's follow-up through the other replica: %d %s", code, b)
	}
	if code, b := askAs(t, other, "sk-b", "GET", "/v1/responses/"+id, ""); code != 404 || strings.TrimSpace(b) != unknown(id) {
		t.Errorf("b, once the other replica found it: %d %s, want 404 %s", code, b, unknown(id))
	}
	if code, b := askAs(t, other, "sk-a", "GET", "/v1/responses/"+named, ""); code != 200 || !strings.Contains(b, named) {
		t.Errorf("a's own name, through the other replica: %d %s", code, b)
	}
}

// TestStoredNotFoundAsPods: the gateway's own 404 for a stored response
// it will not serve is a pod's for an id it does not hold: the body byte
// for byte and its Content-Type, as the gateway relays one (for the key
// an id was made for, sought on the pod) and as the pod sends it. On the
// wire, another key's response and an id no one made get the same answer
// but for the id, the Date and the X-Request-Id.
func TestStoredNotFoundAsPods(t *testing.T) {
	p, gateways := keyedResponses(t, 1)
	s := gateways[0]
	resp, b := send(t, client, s, "POST", "/v1/responses", `{"model":"m","input":"hello"}`, "Content-Type", "application/json", "Authorization", "Bearer sk-a")
	var made struct{ ID string }
	if err := json.Unmarshal([]byte(b), &made); resp.StatusCode != 200 || err != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	// An id made for a that no pod holds: sought on the pod for a.
	never := taggedID(t, "sk-a")
	// get answers GET id from addr, its Date and X-Request-Id dropped and
	// the id written as ID.
	get := func(addr, key, id string) (head, body string) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /v1/responses/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", id, key)
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		head, body, _ = strings.Cut(string(b), "\r\n\r\n")
		head = regexp.MustCompile(`(?m)^(Date|X-Request-Id): .*\r\n`).ReplaceAllString(head+"\r\n", "")
		return strings.ReplaceAll(head, id, "ID"), body
	}
	contentType := regexp.MustCompile(`(?m)^Content-Type: .*$`)
	podHead, podBody := get(p.Addr(), "", never)
	relayedHead, relayedBody := get(s.Addr(), "sk-a", never)
	ownHead, ownBody := get(s.Addr(), "sk-b", never)
	if ownBody != podBody || relayedBody != podBody {
		t.Errorf("404 bodies:\n%s (the gateway's)\n%s (relayed)\nwant the pod's:\n%s", ownBody, relayedBody, podBody)
	}
	if want := contentType.FindString(podHead); contentType.FindString(ownHead) != want || contentType.FindString(relayedHead) != want {
		t.Errorf("404 heads:\n%s(the gateway's)\n%s(relayed)\nwant the pod's %q", ownHead, relayedHead, want)
	}
	otherHead, otherBody := get(s.Addr(), "sk-b", made.ID)
	if otherHead != ownHead || otherBody != strings.ReplaceAll(ownBody, never, made.ID) {
		t.Errorf("another key's response:\n%s\n%s\nwant as an id no one made:\n%s\n%s", otherHead, otherBody, ownHead, ownBody)
	}
}

// TestResponsesIDOfAnotherKey: with api_keys set, a key cannot name its
// response (request_id) after another key's, which would take that
// response over (vLLM stores the new one in its place) through this
// replica or another that does not remember it; nor learn whether the id
// exists: every id not made for the key is refused alike.
func TestResponsesIDOfAnotherKey(t *testing.T) {
	_, gateways := keyedResponses(t, 2)
	made, other := gateways[0], gateways[1]
	code, answer := askAs(t, made, "sk-a", "POST", "/v1/responses", `{"model":"m","input":"hello"}`)
	var r struct{ ID string }
	if err := json.Unmarshal([]byte(answer), &r); code != 200 || err != nil {
		t.Fatalf("a: create: %d %s", code, answer)
	}
	never := taggedID(t, "sk-a") // a's, made by no one
	taking := func(s *lb.Server, id string) (int, string) {
		t.Helper()
		code, b := askAs(t, s, "sk-b", "POST", "/v1/responses", `{"model":"m","input":"mine now","request_id":"`+id+`"}`)
		return code, strings.ReplaceAll(b, id, "ID")
	}
	wantCode, want := taking(made, never)
	if wantCode != 400 {
		t.Errorf("b names an id made for a: %d %s, want 400", wantCode, want)
	}
	for _, s := range []*lb.Server{made, other} {
		if code, b := taking(s, r.ID); code != wantCode || b != want {
			t.Errorf("b names a's response: %d %s, want %d %s", code, b, wantCode, want)
		}
	}
	if code, b := askAs(t, made, "sk-a", "GET", "/v1/responses/"+r.ID, ""); code != 200 || b != answer {
		t.Errorf("a: GET its response: %d %s, want 200 %s", code, b, answer)
	}
}

// responseKeys are the API keys of the stored-response tests: a's
// "sk-a", b's "sk-b".
var responseKeys = []limits.APIKey{{Name: "a", SHA256: limits.HashKey("sk-a")}, {Name: "b", SHA256: limits.HashKey("sk-b")}}

// keyedResponses starts a sim pod that stores responses and n gateways
// (replicas) in front of it with responseKeys.
func keyedResponses(t *testing.T, n int) (*sim.Pod, []*lb.Server) {
	t.Helper()
	p, err := sim.Start(sim.Config{Name: "p", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4, ResponsesStore: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	gateways := make([]*lb.Server, n)
	for i := range gateways {
		gateways[i] = testGateway(t, podsOf("m", p), func(c *config.Config) { c.Access.APIKeys = responseKeys })
	}
	return p, gateways
}

// askAs sends a JSON request to s with key and returns the answer's
// status and body.
func askAs(t *testing.T, s *lb.Server, key, method, path, body string) (int, string) {
	t.Helper()
	resp, b := send(t, client, s, method, path, body, "Content-Type", "application/json", "Authorization", "Bearer "+key)
	return resp.StatusCode, b
}

// taggedID is a response id made for key, one of responseKeys, as a
// gateway (or the key's holder) makes one: a new one at each call.
func taggedID(t *testing.T, key string) string {
	t.Helper()
	keys, err := limits.NewKeys(responseKeys)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := keys.Lookup([]byte("Bearer "+key), nil)
	var id [16]byte
	if _, err := rand.Read(id[:8]); err != nil {
		t.Fatal(err)
	}
	k.TagID(&id)
	return "resp_" + hex.EncodeToString(id[:])
}

package lb_test

import (
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
	p, err := sim.Start(sim.Config{Name: "p", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4, ResponsesStore: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	s := testGateway(t, podsOf("m", p), func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{{Name: "a", SHA256: limits.HashKey("sk-a")}, {Name: "b", SHA256: limits.HashKey("sk-b")}}
	})
	ask := func(key, method, path, body string) (int, string) {
		t.Helper()
		resp, b := send(t, client, s, method, path, body, "Content-Type", "application/json", "Authorization", "Bearer "+key)
		return resp.StatusCode, b
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
	named := create("sk-a", `,"request_id":"resp_guessable"`)
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
// the key it was made for, whose tag its id carries, and for no other:
// another key, and an id the client named, get the 404 of an id no pod
// holds.
func TestResponsesOwnedAcrossReplicas(t *testing.T) {
	p, err := sim.Start(sim.Config{Name: "p", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4, ResponsesStore: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	keys := func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{{Name: "a", SHA256: limits.HashKey("sk-a")}, {Name: "b", SHA256: limits.HashKey("sk-b")}}
	}
	made, other := testGateway(t, podsOf("m", p), keys), testGateway(t, podsOf("m", p), keys)
	ask := func(s *lb.Server, key, method, path, body string) (int, string) {
		t.Helper()
		resp, b := send(t, client, s, method, path, body, "Content-Type", "application/json", "Authorization", "Bearer "+key)
		return resp.StatusCode, b
	}
	var ids []string
	for _, extra := range []string{"", `,"request_id":"resp_named"`} {
		code, b := ask(made, "sk-a", "POST", "/v1/responses", `{"model":"m","input":"hello"`+extra+`}`)
		var r struct{ ID string }
		if err := json.Unmarshal([]byte(b), &r); code != 200 || err != nil || r.ID == "" {
			t.Fatalf("create: %d %s", code, b)
		}
		ids = append(ids, r.ID)
	}
	id, named := ids[0], ids[1]
	_, never := ask(other, "sk-a", "GET", "/v1/responses/resp_never", "")
	unknown := func(id string) string { return strings.ReplaceAll(strings.TrimSpace(never), "resp_never", id) }
	// b first: a found response is remembered as a's.
	if code, b := ask(other, "sk-b", "GET", "/v1/responses/"+id, ""); code != 404 || strings.TrimSpace(b) != unknown(id) {
		t.Errorf("b, through the other replica: %d %s, want 404 %s", code, b, unknown(id))
	}
	if code, b := ask(other, "sk-a", "GET", "/v1/responses/"+id, ""); code != 200 || !strings.Contains(b, id) {
		t.Errorf("a, through the other replica: %d %s", code, b)
	}
	if code, b := ask(other, "sk-a", "POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"`+id+`"}`); code != 200 {
		t.Errorf("a's follow-up through the other replica: %d %s", code, b)
	}
	if code, b := ask(other, "sk-b", "GET", "/v1/responses/"+id, ""); code != 404 || strings.TrimSpace(b) != unknown(id) {
		t.Errorf("b, once the other replica found it: %d %s, want 404 %s", code, b, unknown(id))
	}
	if code, b := ask(other, "sk-a", "GET", "/v1/responses/"+named, ""); code != 404 || strings.TrimSpace(b) != unknown(named) {
		t.Errorf("a's own name, through the other replica: %d %s, want 404 %s", code, b, unknown(named))
	}
}

// TestStoredNotFoundAsPods: the gateway's own 404 for a stored response
// it will not serve is a pod's for an id it does not hold: the body byte
// for byte and its Content-Type, as the gateway relays one (for the key
// an id was made for, sought on the pod) and as the pod sends it. On the
// wire, another key's response and an id no one made get the same answer
// but for the id, the Date and the X-Request-Id.
func TestStoredNotFoundAsPods(t *testing.T) {
	p, err := sim.Start(sim.Config{Name: "p", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4, ResponsesStore: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	apiKeys := []limits.APIKey{{Name: "a", SHA256: limits.HashKey("sk-a")}, {Name: "b", SHA256: limits.HashKey("sk-b")}}
	s := testGateway(t, podsOf("m", p), func(c *config.Config) { c.Access.APIKeys = apiKeys })
	resp, b := send(t, client, s, "POST", "/v1/responses", `{"model":"m","input":"hello"}`, "Content-Type", "application/json", "Authorization", "Bearer sk-a")
	var made struct{ ID string }
	if err := json.Unmarshal([]byte(b), &made); resp.StatusCode != 200 || err != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	// An id made for a that no pod holds: sought on the pod for a.
	keys, err := limits.NewKeys(apiKeys)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := keys.Lookup([]byte("Bearer sk-a"), nil)
	var nonce [16]byte
	a.TagID(&nonce)
	never := "resp_" + hex.EncodeToString(nonce[:])
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

package lb_test

import (
	"encoding/json"
	"net/http"
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

package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestPost: a 200 answer read whole is timed; any other status is an error.
func TestPost(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) == "fail" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if d, err := post(client, srv.URL, []byte(`{"x":1}`)); err != nil || d <= 0 {
		t.Errorf("a 200: took %v, err %v", d, err)
	}
	if _, err := post(client, srv.URL, []byte("fail")); err == nil {
		t.Error("a 503 was not an error")
	}
}

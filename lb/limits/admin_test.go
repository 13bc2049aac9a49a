package limits

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestAdminGuard(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	f := func(token, remote, authorization string, want int) {
		t.Helper()
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.RemoteAddr = remote
		if authorization != "" {
			r.Header.Set("Authorization", authorization)
		}
		w := httptest.NewRecorder()
		AdminGuard(token, ok).ServeHTTP(w, r)
		if w.Code != want {
			t.Fatalf("token %q from %s with %q: %d, want %d", token, remote, authorization, w.Code, want)
		}
		if want == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
			t.Fatal("401 without WWW-Authenticate")
		}
	}
	// No token: loopback peers only.
	f("", "127.0.0.1:5000", "", http.StatusTeapot)
	f("", "[::1]:5000", "", http.StatusTeapot)
	f("", "10.0.0.1:5000", "", http.StatusForbidden)
	f("", "10.0.0.1:5000", "Bearer anything", http.StatusForbidden)
	f("", "garbage", "", http.StatusForbidden)
	// A token: required from everyone, loopback included.
	f("s3cret", "10.0.0.1:5000", "Bearer s3cret", http.StatusTeapot)
	f("s3cret", "127.0.0.1:5000", "bearer s3cret", http.StatusTeapot)
	f("s3cret", "127.0.0.1:5000", "", http.StatusUnauthorized)
	f("s3cret", "10.0.0.1:5000", "Bearer s3cre", http.StatusUnauthorized)
	f("s3cret", "10.0.0.1:5000", "Bearer s3cret2", http.StatusUnauthorized)
	f("s3cret", "10.0.0.1:5000", "Basic s3cret", http.StatusUnauthorized)
	f("s3cret", "10.0.0.1:5000", "s3cret", http.StatusUnauthorized)
}

// TestAdminGuardLive puts the guard in front of a real loopback listener.
func TestAdminGuardLive(t *testing.T) {
	srv := httptest.NewServer(AdminGuard("tok", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })))
	defer srv.Close()
	f := func(auth string, want int) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/admin/pods", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%q: %d, want %d", auth, resp.StatusCode, want)
		}
	}
	f("", http.StatusUnauthorized)
	f("Bearer tok", http.StatusOK)
}

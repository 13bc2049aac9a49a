package limits

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// AdminGuard wraps the admin listener's handler (metrics, pprof, /admin).
//
// With a token, every request must carry "Authorization: Bearer <token>";
// any other gets 401. The comparison is of the SHA-256 digests of both
// tokens in constant time, so neither the token's bytes nor its length can
// be learned from response times.
//
// Without a token, only loopback peers are served and others get 403. The
// listener binds loopback by default and Config.Validate refuses a
// non-loopback bind without a token, so this only matters when an address
// that looked local (a host name) was not: the guard fails closed.
func AdminGuard(token string, next http.Handler) http.Handler {
	if token == "" {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !peerIsLoopback(r.RemoteAddr) {
				http.Error(w, "admin: loopback only (set admin_token to serve other addresses)", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !strings.EqualFold(scheme, "bearer") {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pdlb admin"`)
			http.Error(w, "admin: bearer token required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// peerIsLoopback reports whether a request's RemoteAddr (ip:port) is a
// loopback address.
func peerIsLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
